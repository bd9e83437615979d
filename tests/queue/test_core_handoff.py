"""A queue core handed to a successor (``export_state`` / ``import_state``) behaves exactly as
the original would have: same deliveries, same settlements, same expiries, same totals.

The successor lives in another process with another clock: its times are the original's
shifted by an arbitrary offset, and the state crosses as a pickle, as it does between actors.
"""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from daskqueue.queue.core import QueueCore

SHIFT_S = 12_345.5  # the successor's clock reads this much more at the same instant


def core(**kwargs) -> QueueCore:
    return QueueCore(lease_timeout_s=1.0, max_retries=2, retry_backoff_base_s=0.25,
                     retry_backoff_jitter=0.0, **kwargs)


def seqs(lease) -> list[int]:
    return [] if lease is None else [s.first_seq + i for s in lease.spans for i in range(s.count)]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(1, 5), st.integers(0, 2), st.sampled_from([0.0, 0.0, 0.5])),
        st.tuples(st.just("get"), st.integers(1, 6), st.sampled_from([None, "w1", "w2"])),
        st.tuples(st.just("settle"), st.integers(0, 6), st.integers(0, 3)),
        st.tuples(st.just("tick"), st.sampled_from([0.125, 0.5, 1.25])),
        st.tuples(st.just("take_back"), st.sampled_from(["w1", "w2"])),
        st.tuples(st.just("extend"),),
    ),
    max_size=30,
)


class Driver:
    """Applies operations to one core on its own clock and records what they return."""

    def __init__(self, q: QueueCore, clock: float) -> None:
        self.q, self.now, self.leases, self.out = q, clock, [], []

    def apply(self, op: tuple) -> None:
        q, kind = self.q, op[0]
        if kind == "put":
            _, n, priority, delay = op
            chunk = q.new_chunk(n, priority=priority)
            q.put(chunk, now=self.now, not_before=self.now + delay if delay else None)
        elif kind == "get":
            lease = q.get_batch(op[1], now=self.now, owner=op[2])
            self.out.append(("get", seqs(lease)))
            if lease is not None:
                self.leases.append(lease.lease_id)
        elif kind == "settle" and self.leases:
            lease_id = self.leases.pop(0)
            lease = q.lease(lease_id)
            if lease is not None:
                done = min(op[1], lease.count)
                errors = {i: b"boom" for i in range(min(op[2], done))}
                s = q.settle(lease_id, done=done, errors=errors, now=self.now)
                self.out.append(("settle", s))
        elif kind == "tick":
            self.now += op[1]
            self.out.append(("expire", q.expire(now=self.now)))
        elif kind == "take_back":
            self.out.append(("take_back", q.take_back({op[1]}, b"lost", now=self.now)))
        elif kind == "extend":
            self.out.append(("extend", q.extend(list(self.leases), now=self.now)))
        q.validate()


@settings(max_examples=150, deadline=None)
@given(before=OPS, after=OPS)
def test_a_successor_core_goes_on_exactly_as_the_original(before, after):
    original = Driver(core(seed=1), clock=100.0)
    for op in before:
        original.apply(op)
    state = pickle.loads(pickle.dumps(original.q.export_state(now=original.now)))
    successor = Driver(core(seed=1), clock=original.now + SHIFT_S)  # same ids: outputs compare
    successor.q.import_state(state, now=successor.now)
    successor.q.validate()
    successor.leases = list(original.leases)
    original.out = []
    assert successor.q.stats() == original.q.stats()
    for op in after:
        original.apply(op)
        successor.apply(op)
    assert successor.out == original.out
    assert successor.q.stats() == original.q.stats()
    assert [(d.seq, d.attempts, d.error) for d in successor.q.dead] == [
        (d.seq, d.attempts, d.error) for d in original.q.dead
    ]


def test_an_imported_lease_keeps_its_id_deadline_and_owner():
    q = core()
    q.put(q.new_chunk(10), now=0.0)
    lease = q.get_batch(4, now=0.0, owner="w1")
    q.extend([lease.lease_id], now=0.5)  # deadline 1.5
    successor = core(lease_id_base=1 << 40)
    successor.import_state(q.export_state(now=1.0), now=50.0)
    held = successor.lease(lease.lease_id)
    assert held is not None and held.owner == "w1" and held.deadline == 50.5
    assert seqs(successor.get_batch(10, now=50.0)) == [4, 5, 6, 7, 8, 9]
    assert successor.expire(now=50.5) == 4  # its deadline, moved to the successor's clock
    assert seqs(successor.get_batch(10, now=51.0)) == [0, 1, 2, 3]


def test_new_leases_of_a_successor_never_take_an_imported_id():
    q = core()
    q.put(q.new_chunk(10), now=0.0)
    held = [q.get_batch(1, now=0.0).lease_id for _ in range(3)]
    successor = core()  # the same id range: the worst case
    successor.import_state(q.export_state(now=0.0), now=0.0)
    fresh = successor.get_batch(1, now=0.0).lease_id
    assert fresh not in held and all(successor.lease(i) is not None for i in held)


def test_import_needs_an_empty_core():
    q = core()
    q.put(q.new_chunk(1), now=0.0)
    try:
        q.import_state(core().export_state(now=0.0), now=0.0)
    except ValueError as e:
        assert "empty" in str(e)
    else:
        raise AssertionError("import_state into a used core must raise")
