"""Type scheduling in the pure core: fair shares, caps, FIFO within a type. Every core is
validated after every call (``tests.queue.test_core.Validated``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskqueue.queue.policy import TypePolicy
from tests.queue.test_core import make_core, seqs


def typed_core(slots: int = 4, **policy):
    core = make_core(policy=TypePolicy(**policy))
    core.core.slots = slots
    return core


def put(core, count: int, t: str | None, *, priority: int = 0) -> list[int]:
    chunk = core.new_chunk(count, priority=priority, type=t)
    core.put(chunk, now=0.0)
    return list(range(chunk.base_seq, chunk.base_seq + count))


def types_of(core, lease) -> set:
    return {s.chunk.type for s in lease.spans}


# -- TypePolicy ---------------------------------------------------------------------------------


def test_fifo_never_limits():
    assert TypePolicy().limit("a", ready={"a": 5, "b": 5}, slots=4) is None


def test_a_fair_type_alone_may_use_every_slot():
    assert TypePolicy("fair").limit("a", ready={"a": 100}, slots=8) is None


def test_a_fair_share_is_in_proportion_to_ready_messages_capped_at_max_type_share():
    p = TypePolicy("fair", max_type_share=0.8)
    assert p.limit("a", ready={"a": 300, "b": 100}, slots=8) == 6  # 3/4 of 8
    assert p.limit("b", ready={"a": 300, "b": 100}, slots=8) == 2
    assert p.limit("a", ready={"a": 10_000, "b": 1}, slots=10) == 8  # 0.8 of 10
    assert p.limit("b", ready={"a": 10_000, "b": 1}, slots=10) == 1  # at least one


def test_capped_takes_the_lowest_of_share_shared_cap_and_type_cap():
    p = TypePolicy("capped", max_type_cap=3, type_caps={"bulk": 1})
    assert p.limit("bulk", ready={"bulk": 100}, slots=8) == 1
    assert p.limit("other", ready={"other": 100}, slots=8) == 3
    assert p.limit("other", ready={"other": 1, "bulk": 99}, slots=8) == 1  # its share


def test_unknown_slots_leave_only_the_caps():
    p = TypePolicy("capped", type_caps={"bulk": 2})
    assert p.limit("bulk", ready={"bulk": 5, "x": 5}, slots=0) == 2
    assert p.limit("x", ready={"bulk": 5, "x": 5}, slots=0) is None


# -- the core -----------------------------------------------------------------------------------


def test_a_typed_lease_holds_one_type_in_fifo_order():
    core = typed_core(slots=4, scheduler="fair")
    a = put(core, 3, "a")
    b = put(core, 2, "b")
    a2 = put(core, 2, "a")
    lease = core.get_batch(10, now=0)
    assert types_of(core, lease) == {"a"} and seqs(lease) == a + a2
    lease_b = core.get_batch(10, now=0)
    assert seqs(lease_b) == b


def test_fair_lets_a_small_late_type_run_beside_a_large_backlog():
    core = typed_core(slots=2, scheduler="fair", max_type_share=0.8)
    put(core, 1000, "bulk")
    interactive = put(core, 5, "interactive")
    first = core.get_batch(1, now=0)
    assert types_of(core, first) == {"bulk"}  # bulk's share of 2 slots is 1
    second = core.get_batch(1, now=0)
    assert seqs(second) == interactive[:1]  # bulk is at its share: the late type goes


def test_fair_gives_the_first_waiting_message_when_every_type_is_at_its_share():
    core = typed_core(slots=1, scheduler="fair")
    put(core, 10, "a")
    put(core, 10, "b")
    held = [core.get_batch(1, now=0) for _ in range(3)]  # every share is 1 slot
    assert all(lease is not None for lease in held)


def test_capped_never_exceeds_a_types_cap_even_on_idle_slots():
    core = typed_core(slots=8, scheduler="capped", type_caps={"bulk": 2})
    put(core, 100, "bulk")
    first, second = core.get_batch(5, now=0), core.get_batch(5, now=0)
    assert first and second
    assert core.get_batch(5, now=0) is None
    core.settle(first.lease_id, done=first.count, now=0)
    assert types_of(core, core.get_batch(5, now=0)) == {"bulk"}


def test_a_capped_type_does_not_block_the_types_behind_it():
    core = typed_core(slots=8, scheduler="capped", type_caps={"bulk": 1})
    put(core, 100, "bulk")
    other = put(core, 3, "other")
    assert types_of(core, core.get_batch(5, now=0)) == {"bulk"}
    assert seqs(core.get_batch(5, now=0)) == other


def test_running_counts_of_peers_count_towards_the_caps():
    core = typed_core(slots=8, scheduler="capped", type_caps={"bulk": 2})
    put(core, 100, "bulk")
    core.core.peer_running = {"bulk": 2}
    assert core.get_batch(5, now=0) is None
    core.core.peer_running = {"bulk": 1}
    assert core.get_batch(5, now=0) is not None


def test_an_expired_or_taken_back_lease_frees_its_types_slot():
    core = typed_core(slots=8, scheduler="capped", type_caps={"bulk": 1})
    put(core, 10, "bulk")
    lease = core.get_batch(2, now=0, owner="w1")
    assert core.get_batch(2, now=0) is None
    core.take_back({"w1"}, b"e\x00m\x00t", now=0)
    assert core.type_counts()["bulk"][1] == 0
    assert core.get_batch(2, now=100) is not None  # after the retry's backoff
    assert lease is not None


def test_higher_priority_goes_first_across_types():
    core = typed_core(slots=4, scheduler="fair")
    put(core, 5, "a")
    urgent = put(core, 1, "b", priority=5)
    assert seqs(core.get_batch(10, now=0)) == urgent


def test_type_counts_report_ready_messages_and_running_batches():
    core = typed_core(slots=4, scheduler="fair")
    put(core, 5, "a")
    put(core, 2, None)
    core.get_batch(2, now=0)
    assert core.type_counts() == {"a": (3, 1), None: (2, 0)}


def test_a_hand_off_keeps_the_running_counts():
    old = typed_core(slots=4, scheduler="capped", type_caps={"a": 1})
    put(old, 5, "a")
    old.get_batch(2, now=0)
    new = typed_core(slots=4, scheduler="capped", type_caps={"a": 1})
    new.import_state(old.export_state(now=0), now=0)
    assert new.type_counts() == {"a": (3, 1)}
    assert new.get_batch(1, now=0) is None


@settings(max_examples=150, deadline=None)
@given(
    caps=st.dictionaries(st.sampled_from("abc"), st.integers(1, 3), max_size=3),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.sampled_from("abc"), st.integers(1, 20)),
            st.tuples(st.just("get"), st.integers(1, 8)),
            st.tuples(st.just("settle"), st.integers(0, 10), st.booleans()),
        ),
        max_size=60,
    ),
)
def test_capped_running_batches_never_exceed_a_cap_and_each_type_stays_fifo(caps, ops):
    core = typed_core(slots=4, scheduler="capped", type_caps=caps)
    leases = []
    delivered: dict[str, list[int]] = {}
    for op in ops:
        if op[0] == "put":
            put(core, op[2], op[1])
        elif op[0] == "get":
            lease = core.get_batch(op[1], now=0)
            if lease is not None:
                (t,) = types_of(core, lease)
                first = delivered.setdefault(t, [])
                first.extend(s for s in seqs(lease) if s not in first)  # first deliveries
                leases.append(lease)
        elif leases:
            lease = leases.pop(op[1] % len(leases))
            # Messages run to the end (ack) or none ran (release: they come back first).
            core.settle(lease.lease_id, done=lease.count if op[2] else 0, now=0)
        for t, (_, running) in core.type_counts().items():
            assert running <= caps.get(t, 99)
    for t, got in delivered.items():  # each message first delivered in put order
        assert got == sorted(got), f"type {t} out of order"


def test_max_scan_bounds_the_look_ahead():
    core = typed_core(slots=8, scheduler="capped", type_caps={"bulk": 1}, max_scan=2)
    for _ in range(3):
        put(core, 1, "bulk")
    put(core, 1, "other")
    assert core.get_batch(1, now=0) is not None  # one bulk
    assert core.get_batch(1, now=0) is None  # "other" is 3 runs back, beyond max_scan


@pytest.mark.parametrize("scheduler", ["fair", "capped"])
def test_delayed_messages_count_once_due(scheduler):
    core = typed_core(slots=2, scheduler=scheduler)
    chunk = core.new_chunk(3, type="a")
    core.put(chunk, now=0.0, not_before=5.0)
    assert core.get_batch(3, now=1.0) is None
    assert seqs(core.get_batch(3, now=5.0)) == [0, 1, 2]


# -- reserved slots: a minimum priority ------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["fifo", "fair"])
def test_get_batch_with_a_minimum_priority_takes_only_urgent_messages(scheduler):
    core = typed_core(slots=2, scheduler=scheduler)
    put(core, 5, "bulk")
    assert core.get_batch(5, now=0, min_priority=1) is None
    urgent = put(core, 2, "bulk", priority=3)
    lease = core.get_batch(5, now=0, min_priority=1)
    assert seqs(lease) == urgent
    assert core.get_batch(5, now=0, min_priority=1) is None
    assert len(seqs(core.get_batch(5, now=0))) == 5


def test_a_typed_batch_takes_the_callers_size_for_its_type():
    core = typed_core(slots=2, scheduler="fair")
    put(core, 100, "short")
    lease = core.get_batch(2, now=0, sizes={"short": 30, "long": 1})
    assert lease.count == 30
