"""SentIds: a list batch_submit handed out comes back to as_completed by its kept copy,
once, and only if it is unchanged; memory stays bounded."""

import pytest

from daskqueue.messages import id_range, make_id
from daskqueue.sent_ids import SentIds, merge_runs

pytestmark = pytest.mark.timeout(30)


def _ids(q, first, count):
    return list(id_range(q, first, count))


def test_a_list_handed_out_is_recalled_once_with_its_runs():
    kept = SentIds(min_ids=2, streaming=True)
    ids = _ids(0, 5, 10) + _ids(1, 0, 10)
    runs = [(0, 5, 10, 0), (1, 0, 10, 10)]
    kept.remember(ids, runs)
    got = kept.recall(list(ids))  # an equal list of the same objects
    assert got is not None and got[0] == ids and got[1] == runs and got[0] is not ids
    assert kept.recall(ids) is None  # taken once
    assert len(kept) == 0


@pytest.mark.parametrize("change", ["swap", "middle", "append", "pop", "other objects"])
def test_a_list_changed_since_is_not_trusted(change):
    kept = SentIds(min_ids=2, streaming=True)
    ids = _ids(0, 0, 100)
    kept.remember(ids, [(0, 0, 100, 0)])
    if change == "swap":
        ids[3], ids[4] = ids[4], ids[3]
    elif change == "middle":
        ids[50] = make_id(1, 50)
    elif change == "append":
        ids.append(make_id(0, 100))
    elif change == "pop":
        ids.pop(10)
    if change == "other objects":  # equal values, made anew: trusted (compared by value)
        assert kept.recall([i + 0 for i in ids]) is not None
    else:
        assert kept.recall(ids) is None


def test_small_lists_are_not_kept_and_the_oldest_go_first_past_the_bound():
    kept = SentIds(min_ids=10, max_ids=250, streaming=True)
    kept.remember(_ids(0, 0, 9), [(0, 0, 9, 0)])
    assert len(kept) == 0
    lists = [_ids(0, 100 * k, 100) for k in range(3)]
    for k, ids in enumerate(lists):
        kept.remember(ids, [(0, 100 * k, 100, 0)])
    assert len(kept) == 2  # 300 ids > 250: the first went
    assert kept.recall(lists[0]) is None
    assert kept.recall(lists[1]) is not None and kept.recall(lists[2]) is not None
    assert kept.recall(["not", "ids", "but", "a", "list", "of", "eleven", "strings", "x", "y", "z"]) is None
    assert kept.recall([[1]] * 20) is None  # unhashable items: not a list handed out


def test_merge_runs_joins_runs_that_go_on_and_keeps_the_others():
    runs = [(1, 0, 5, 10), (0, 0, 5, 0), (0, 5, 5, 5), (0, 10, 5, 15), (0, 16, 4, 20)]
    assert merge_runs(runs) == [(0, 0, 10, 0), (1, 0, 5, 10), (0, 10, 5, 15), (0, 16, 4, 20)]


def test_nothing_is_kept_until_a_stream_starts_and_after_a_list_is_dropped_unrecalled():
    kept = SentIds(min_ids=10, max_ids=250)
    ids = _ids(0, 0, 100)
    assert kept.min_ids > 10**12  # a sender offers nothing: no runs found, no copy
    kept.remember(ids, [(0, 0, 100, 0)])
    assert len(kept) == 0
    assert kept.recall(ids) is None  # the stream starts with this list (taken the general way)
    assert kept.min_ids == 10
    lists = [_ids(0, 100 * k, 100) for k in range(1, 4)]
    for k, listed in enumerate(lists, 1):
        kept.remember(listed, [(0, 100 * k, 100, 0)])
    assert len(kept) == 2 and kept.min_ids > 10**12  # one dropped unrecalled: keeping stopped
    kept.remember(_ids(1, 0, 100), [(1, 0, 100, 0)])
    assert len(kept) == 2
    assert kept.recall(lists[2]) is not None  # what was kept still comes back, and keeping goes on
    assert kept.min_ids == 10
