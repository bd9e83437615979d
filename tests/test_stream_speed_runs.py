"""as_completed(ids)'s id runs, found by their ends and checked in C: the same runs as a walk
over every id, for batch_submit's ids and for ids that only look consecutive at the ends."""

import random

import pytest

from daskqueue.messages import make_id, split_id
from daskqueue.stream_claim import id_runs

pytestmark = pytest.mark.timeout(30)


def _walked(ids):
    """The runs by a walk over every id (the reference), None on overlapping runs."""
    runs, start = [], 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or ids[k] != ids[k - 1] + 1:
            runs.append((*split_id(ids[start]), k - start, start))
            start = k
    seen = set()
    for q, first, count, _ in runs:
        span = {(q, s) for s in range(first, first + count)}
        if seen & span:
            return None
        seen |= span
    return runs


def _batch_submit_ids(n, n_queues, batch):
    ids, seqs = [], [3] * n_queues
    for k, lo in enumerate(range(0, n, batch)):
        q, count = k % n_queues, min(batch, n - lo)
        ids += [make_id(q, s) for s in range(seqs[q], seqs[q] + count)]
        seqs[q] += count
    return ids


def test_runs_of_batch_submit_ids_are_the_walked_runs():
    for n, n_queues, batch in [(1, 1, 1), (10, 2, 3), (1000, 3, 17), (5000, 2, 1000), (4097, 1, 4097)]:
        ids = _batch_submit_ids(n, n_queues, batch)
        assert id_runs(ids) == _walked(ids)


def test_ids_that_look_consecutive_only_at_the_ends_are_split_where_they_break():
    a = make_id(0, 100)
    # Ends fit one run of 8 (a .. a + 7 seqs) but the middle is swapped or from another queue.
    swapped = [a + k for k in (0, 1, 3, 2, 4, 5, 6, 7)]
    other = [a, a + 1, make_id(1, 0), a + 3]
    repeated = [a, a + 1, a + 1, a + 3]
    assert id_runs(swapped) == _walked(swapped) == [(0, 100, 2, 0), (0, 103, 1, 2), (0, 102, 1, 3), (0, 104, 4, 4)]
    assert id_runs(other) == _walked(other)
    assert id_runs(repeated) is None and _walked(repeated) is None


def test_random_ids_give_the_walked_runs():
    rng = random.Random(24)
    for _ in range(300):
        ids = _batch_submit_ids(rng.randrange(1, 300), rng.randrange(1, 4), rng.randrange(1, 50))
        for _ in range(rng.randrange(0, 4)):  # a few swaps, repeats or foreign ids
            i, j = rng.randrange(len(ids)), rng.randrange(len(ids))
            choice = rng.randrange(3)
            if choice == 0:
                ids[i], ids[j] = ids[j], ids[i]
            elif choice == 1:
                ids[i] = ids[j]
            else:
                ids[i] = make_id(rng.randrange(4), rng.randrange(1000))
        assert id_runs(ids) == _walked(ids), ids


def test_a_chunk_of_100k_batch_submit_ids_is_six_runs():
    ids = _batch_submit_ids(100_000, 2, 16_667)
    assert id_runs(ids) == _walked(ids) and len(id_runs(ids)) == 6


def test_the_arrival_log_keeps_a_parked_run_as_its_range():
    import tracemalloc

    from daskqueue.arrivals import Arrivals

    log = Arrivals()
    cursor = log.end()
    tracemalloc.start()
    try:
        log.add(range(make_id(1, 0), make_id(1, 1_000_000)))  # a parked run of a million results
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert grown < 100_000  # not a million ids written out (~36 MB)
    assert len(log) == 1_000_000
    log.add((7,))
    assert log.since(cursor)[-3:] == [make_id(1, 999_998), make_id(1, 999_999), 7]
