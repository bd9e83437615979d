"""The consistent-hash ring that routes types and keys to queues."""

from __future__ import annotations

import pytest

from daskqueue.queue.ring import HashRing, stable_hash

KEYS = [f"key-{i}" for i in range(20_000)]


def test_the_same_string_always_goes_to_the_same_queue():
    a, b = HashRing(range(4)), HashRing([3, 1, 0, 2])
    assert [a.node(k) for k in KEYS[:500]] == [b.node(k) for k in KEYS[:500]]
    assert stable_hash("x") == stable_hash("x") != stable_hash("y")


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_adding_a_queue_moves_about_one_in_n_plus_one_keys_and_only_to_the_new_queue(n):
    before, after = HashRing(range(n)), HashRing(range(n + 1))
    moved = [k for k in KEYS if before.node(k) != after.node(k)]
    assert all(after.node(k) == n for k in moved)  # keys only move onto the new queue
    assert abs(len(moved) / len(KEYS) - 1 / (n + 1)) < 0.5 / (n + 1)


def test_removing_a_queue_moves_only_its_keys():
    ring = HashRing(range(5))
    owner = {k: ring.node(k) for k in KEYS}
    ring.remove(2)
    assert all(ring.node(k) == q for k, q in owner.items() if q != 2)
    assert 2 not in {ring.node(k) for k in KEYS}


def test_every_queue_gets_a_fair_part_of_the_keys():
    ring = HashRing(range(8))
    load = [0] * 8
    for k in KEYS:
        load[ring.node(k)] += 1
    assert max(load) < 1.3 * len(KEYS) / 8


def test_a_queue_is_on_the_ring_once():
    ring = HashRing(range(2))
    with pytest.raises(ValueError):
        ring.add(1)
    with pytest.raises(ValueError):
        ring.remove(7)
