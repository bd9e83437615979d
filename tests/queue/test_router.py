"""The client's pure router: targets, round-robin, key and type rings, waves and runs."""

from __future__ import annotations

from daskqueue.queue.router import Router, consecutive_runs, waves


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
