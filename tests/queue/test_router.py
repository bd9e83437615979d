"""The client's pure router: targets, round-robin, even spreading of a call, key and type
rings, waves and runs."""

from __future__ import annotations

import pytest

from daskqueue.queue.router import Router, batch_count, consecutive_runs, even_ranges, waves

pytestmark = pytest.mark.timeout(30)


def test_round_robin_goes_over_the_targets_in_turn():
    r = Router(range(3), typed=False)
    assert [r.next_target() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert r.route(None, None) is None and r.spread(None) == 3


def test_a_key_goes_to_one_queue_and_most_keys_stay_when_a_queue_is_added():
    r = Router(range(4), typed=False)
    keys = [f"k{i}" for i in range(1000)]
    before = {k: r.route(None, k) for k in keys}
    assert all(before[k] == r.key_queue(k) for k in keys)
    r.route_to(range(5))
    moved = sum(before[k] != r.key_queue(k) for k in keys)
    assert 100 < moved < 350  # about 1/5 of the keys, not 4/5


def test_a_typed_router_sends_a_type_to_one_queue_whatever_the_key():
    r = Router(range(3), typed=True)
    q = r.route("gpu", None)
    assert q is not None and r.route("gpu", "any-key") == q and r.spread(q) == 1


def test_removed_targets_get_nothing():
    r = Router(range(3), typed=False)
    r.route_to([0, 2])
    assert {r.next_target() for _ in range(10)} == {0, 2}
    assert all(r.key_queue(f"k{i}") in (0, 2) for i in range(200))


def test_waves_send_a_queues_batches_one_per_wave_in_order():
    keyed = [(0, "a"), (1, "b"), (0, "c"), (0, "d"), (2, "e")]
    assert waves(keyed) == [[(0, "a"), (1, "b"), (2, "e")], [(0, "c")], [(0, "d")]]


def test_consecutive_runs_split_a_group_at_gaps_in_positions():
    assert consecutive_runs(10, range(5, 9)) == [(10, 4, 5)]
    assert consecutive_runs(10, [0, 1, 4, 5, 6, 9]) == [(10, 2, 0), (12, 3, 4), (15, 1, 9)]


def spread_counts(n, n_queues, put_batch_size, router=None, fixed=None):
    """Messages per queue of one call of ``n`` sent as the pool sends it."""
    r = router or Router(range(n_queues), typed=False)
    spread = r.spread(fixed)
    ranges = even_ranges(n, batch_count(n, spread=spread, put_batch_size=put_batch_size))
    counts = dict.fromkeys(r.targets, 0)
    for q, positions in zip(r.assign(len(ranges), fixed), ranges):
        assert len(positions) <= put_batch_size
        counts[q] += len(positions)
    return counts


@pytest.mark.parametrize("n, n_queues, put_batch_size", [
    (60_000, 2, 20_000),  # the case: 3 batches of 20,000 made 40,000 / 20,000
    (60_001, 2, 20_000), (1_000_001, 3, 20_000), (7, 4, 2), (3, 4, 10), (41, 3, 10), (20_000, 2, 20_000),
])
def test_one_call_is_spread_evenly_over_the_queues_within_one_message(n, n_queues, put_batch_size):
    counts = spread_counts(n, n_queues, put_batch_size)
    assert sum(counts.values()) == n
    assert max(counts.values()) - min(counts.values()) <= 1


def test_even_ranges_are_consecutive_and_differ_by_at_most_one():
    assert even_ranges(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert even_ranges(2, 4) == [range(0, 1), range(1, 2)] and even_ranges(0, 1) == []


def test_small_calls_in_a_row_rotate_over_the_queues():
    r = Router(range(2), typed=False)
    totals = {0: 0, 1: 0}
    for _ in range(10):  # 3 messages on 2 queues: 2 + 1 each time, the 2 not always on one queue
        for q, c in spread_counts(3, 2, 10, router=r).items():
            totals[q] += c
    assert totals == {0: 15, 1: 15}
    assert [r.next_target() for _ in range(4)] in ([0, 1, 0, 1], [1, 0, 1, 0])


def test_a_routed_call_stays_on_its_queue_in_batches_within_the_limit():
    r = Router(range(3), typed=True)
    q = r.route("gpu", None)
    counts = spread_counts(50, 3, 20, router=r, fixed=q)
    assert counts[q] == 50 and sum(counts.values()) == 50
    assert batch_count(50, spread=1, put_batch_size=20) == 3


def test_removed_targets_get_no_batch_of_a_spread_call():
    r = Router(range(3), typed=False)
    r.route_to([0, 2])
    counts = spread_counts(1000, 3, 100, router=r)
    assert counts == {0: 500, 2: 500}
