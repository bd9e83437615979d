"""Keyed messages in the pure core: one at a time per key, in put order, across retries,
releases, expiry, hand-offs and both delivery paths (FIFO and typed)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from daskqueue.queue.policy import TypePolicy
from tests.queue.test_core import make_core, seqs

ERROR = b"E\x00boom\x00tb"


def put(core, count: int, key: str | None, *, priority: int = 0, type: str | None = None) -> list[int]:
    chunk = core.new_chunk(count, priority=priority, key=key, type=type)
    core.put(chunk, now=0.0)
    return list(range(chunk.base_seq, chunk.base_seq + count))


def test_a_batch_holds_at_most_one_message_per_key_and_unkeyed_ones_freely():
    core = make_core()
    a = put(core, 3, "a")
    b = put(core, 2, "b")
    free = put(core, 3, None)
    lease = core.get_batch(10, now=0)
    assert seqs(lease) == [a[0], b[0]] + free


def test_the_next_message_of_a_key_waits_until_the_previous_is_settled():
    core = make_core()
    a = put(core, 3, "a")
    first = core.get_batch(10, now=0)
    assert seqs(first) == a[:1]
    assert core.get_batch(10, now=0) is None
    core.settle(first.lease_id, done=1, now=0)
    assert seqs(core.get_batch(10, now=0)) == a[1:2]


def test_a_failed_message_is_retried_before_its_keys_next_message():
    core = make_core()
    a = put(core, 2, "a")
    lease = core.get_batch(10, now=0)
    core.settle(lease.lease_id, done=1, errors={0: ERROR}, now=0)
    assert core.get_batch(10, now=0.1) is None  # the retry waits its backoff; a[1] waits too
    retry = core.get_batch(10, now=100)
    assert seqs(retry) == a[:1]
    core.settle(retry.lease_id, done=1, now=100)
    assert seqs(core.get_batch(10, now=100)) == a[1:]


def test_an_expired_lease_keeps_its_key_until_the_retry_ran():
    core = make_core()
    a = put(core, 2, "a")
    core.get_batch(1, now=0)
    core.expire(now=1000)
    assert seqs(core.get_batch(10, now=2000)) == a[:1]


def test_a_dead_lettered_message_frees_its_key():
    core = make_core(max_retries=0)
    a = put(core, 2, "a")
    lease = core.get_batch(10, now=0)
    core.settle(lease.lease_id, done=1, errors={0: ERROR}, now=0)
    assert seqs(core.get_batch(10, now=0)) == a[1:]


def test_a_released_message_frees_its_key_and_comes_back_first():
    core = make_core()
    a = put(core, 2, "a")
    lease = core.get_batch(10, now=0)
    core.settle(lease.lease_id, done=0, now=0)
    assert seqs(core.get_batch(10, now=0)) == a[:1]


def test_a_blocked_key_does_not_block_other_keys_behind_it():
    core = make_core()
    put(core, 5, "a")
    b = put(core, 1, "b")
    core.get_batch(1, now=0)  # a's first
    assert seqs(core.get_batch(10, now=0)) == b


def test_keys_under_a_typed_policy_also_run_one_at_a_time():
    core = make_core(policy=TypePolicy("fair"))
    core.core.slots = 4
    a = put(core, 3, "a", type="t")
    assert seqs(core.get_batch(10, now=0)) == a[:1]
    assert core.get_batch(10, now=0) is None


def test_a_hand_off_keeps_the_keys_held():
    old = make_core()
    a = put(old, 2, "a")
    old.get_batch(10, now=0)
    new = make_core()
    new.import_state(old.export_state(now=0), now=0)
    assert new.get_batch(10, now=0) is None
    (lease,) = new.leases()
    new.settle(lease.lease_id, done=1, now=0)
    assert seqs(new.get_batch(10, now=0)) == a[1:]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(["a", "b", "c", None]), st.integers(1, 5)),
    st.tuples(st.just("get"), st.integers(1, 6)),
    st.tuples(st.just("settle"), st.integers(0, 9), st.sampled_from(["ack", "fail", "release"])),
    st.tuples(st.just("tick"),),
), max_size=80))
def test_each_key_runs_one_at_a_time_and_completes_in_put_order(ops):
    core = make_core(max_retries=5)
    now = 0.0
    key_of: dict[int, str | None] = {}
    leases = []
    completed: dict[str, list[int]] = {}
    for op in ops:
        if op[0] == "put":
            for s in put(core, op[2], op[1]):
                key_of[s] = op[1]
        elif op[0] == "get":
            lease = core.get_batch(op[1], now=now)
            if lease is not None:
                leases.append(lease)
        elif op[0] == "tick":
            now += 100.0  # retries fall due
        elif leases:
            lease = leases.pop(op[1] % len(leases))
            if op[2] == "ack":
                core.settle(lease.lease_id, done=lease.count, now=now)
                for s in seqs(lease):
                    if key_of[s] is not None:
                        completed.setdefault(key_of[s], []).append(s)
            elif op[2] == "fail":
                core.settle(lease.lease_id, done=lease.count, errors=dict.fromkeys(range(lease.count), ERROR), now=now)
            else:
                core.settle(lease.lease_id, done=0, now=now)
        running = [key_of[s] for lease in leases for s in seqs(lease) if key_of[s] is not None]
        assert len(running) == len(set(running)), "two messages of one key at once"
    for key, done in completed.items():
        assert done == sorted(done), f"key {key} completed out of put order"
