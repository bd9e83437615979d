"""The arrival log behind as_completed(ids): a taker scans only outcomes filed since it looked."""

import pytest

from daskqueue.arrivals import Arrivals

pytestmark = pytest.mark.timeout(10)


def test_first_look_and_after_clear_or_compact_scan_everything() -> None:
    log = Arrivals()
    assert log.since(None) is None
    log.add(range(3))
    cursor = log.end()
    log.add([7, 8])
    assert log.since(cursor) == [7, 8]
    log.clear()
    assert log.since(cursor) is None  # cleared: the taker scans the held outcomes once
    assert log.since(log.end()) == []


def test_compaction_keeps_held_ids_and_moves_the_epoch() -> None:
    log = Arrivals()
    log.add(range(300_000))
    cursor = log.end()
    log.compact(lambda: list(range(10)), 10)
    assert len(log) == 10 and log.since(cursor) is None
    log.compact(lambda: [], 10)  # short enough: nothing happens
    assert len(log) == 10
    assert log.since(log.end()) == []


def test_collector_take_since_only_new_and_wanted() -> None:
    from daskqueue.messages import make_id
    from daskqueue.results import ResultCollector

    c = ResultCollector(2, call=None, answer=None)  # type: ignore[arg-type]  (no queue is called)
    c._succeed_here(0, 0, list(range(10)))  # outcomes of seqs 0..9 of queue 0, as a poll files them
    got, values, cursor = c.take_since({make_id(0, s) for s in range(5)}, None)
    assert sorted(values) == [0, 1, 2, 3, 4] and sorted(got) == [make_id(0, s) for s in range(5)]
    c._succeed_here(0, 10, [10, 11])
    wanted = {make_id(0, 11), make_id(0, 7)}
    _, values, cursor = c.take_since(wanted, cursor)
    assert values == [11]  # 7 was filed before the cursor: this taker did not want it then
    _, values, _ = c.take_since(wanted, None)  # a new taker scans everything held
    assert values == [7]
    assert sorted(c.results) == [make_id(0, s) for s in (5, 6, 8, 9, 10)]


def test_an_outcome_filed_twice_is_taken_once() -> None:
    from daskqueue.messages import make_id
    from daskqueue.results import ResultCollector

    c = ResultCollector(1, call=None, answer=None)  # type: ignore[arg-type]
    _, _, cursor = c.take_since({make_id(0, 99)}, None)
    c._succeed_here(0, 0, ["a"])
    c._succeed_here(0, 0, ["a"])  # delivered again (at-least-once): the log holds it twice
    got, values, _ = c.take_since({make_id(0, 0)}, cursor)
    assert got == [make_id(0, 0)] and values == ["a"]


def test_results_taken_with_clear_leave_no_log_behind() -> None:
    from daskqueue.results import ResultCollector

    c = ResultCollector(1, call=None, answer=None)  # type: ignore[arg-type]
    for k in range(30):
        c._succeed_here(0, k * 10_000, list(range(10_000)))
        c.take_all("results")  # what results(clear=True) does
    assert len(c.results) == 0 and len(c._arrivals) == 0
