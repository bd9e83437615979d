"""Moving messages between queues in the pure core (``add_queues`` / ``remove_queue``): the
moved keys' waiting messages leave in put order, a key held here stays and fences its new
queue, and across both queues each key still runs one message at a time, in put order."""

from __future__ import annotations

import os

from hypothesis import example, given, settings
from hypothesis import strategies as st

from daskqueue.queue.core import MOVER
from tests.queue.test_core import LEASE_TIMEOUT_S, make_core, seqs
from tests.queue.test_keys import ERROR, put

MOVED = {"b", "d"}
#: Examples of the property test below; ``DASKQUEUE_MOVE_EXAMPLES`` changes it (a long search).
MOVE_EXAMPLES = int(os.environ.get("DASKQUEUE_MOVE_EXAMPLES", "300"))


def to_new(chunk):
    return 1 if chunk.key in MOVED else None


def key_to_new(key):
    return 1 if key in MOVED else None


def test_waiting_messages_of_moved_keys_leave_in_put_order_and_the_rest_stay():
    core = make_core()
    a = put(core, 2, "a")
    b1 = put(core, 2, "b")
    b2 = put(core, 1, "b", priority=5)
    leases, delays, fences = core.take_moving(to_new, now=0)
    assert list(leases) == [1]
    assert seqs(leases[1]) == b1 + b2 and leases[1].owner == MOVER
    assert delays[1] == [0.0, 0.0] and fences[1] == set()
    assert core.drop_moved(leases[1].lease_id) == 3
    assert seqs(core.get_batch(10, now=0)) == a[:1]
    s = core.stats()
    assert (s.ready, s.leased, s.total_moved) == (1, 1, 3)


def test_a_held_key_keeps_its_running_message_and_fences_the_rest():
    core = make_core()
    b = put(core, 3, "b")
    running = core.get_batch(1, now=0)
    leases, _, fences = core.take_moving(to_new, now=0)
    assert seqs(leases[1]) == b[1:] and fences[1] == {"b"}
    assert core.keys_present({"b", "a"}) == {"b"}
    core.drop_moved(leases[1].lease_id)
    core.settle(running.lease_id, done=1, now=0)
    assert core.keys_present({"b"}) == set()


def test_a_retry_waiting_for_its_backoff_holds_its_key_and_stays():
    core = make_core()
    b = put(core, 2, "b")
    lease = core.get_batch(1, now=0)
    core.settle(lease.lease_id, done=1, errors={0: ERROR}, now=0)
    leases, _, fences = core.take_moving(to_new, now=0)
    assert seqs(leases[1]) == b[1:] and fences[1] == {"b"}
    assert core.stats().delayed == 1


def test_a_key_whose_one_message_runs_here_is_fenced_though_nothing_of_it_moves():
    """Its next put goes to the new queue: that one must wait for the running one."""
    core = make_core()
    put(core, 1, "b")
    running = core.get_batch(1, now=0)
    leases, _, fences = core.take_moving(to_new, now=0)
    assert leases == {} and fences == {1: {"b"}}
    core.settle(running.lease_id, done=1, errors={0: ERROR}, now=0)  # back, for its retry
    leases, _, fences = core.take_moving(to_new, now=0)
    assert leases == {} and fences == {1: {"b"}}  # the retry holds the key here


def test_a_lease_that_expires_after_the_move_keeps_its_key_fenced_at_the_new_queue():
    old, new = make_core(), make_core()
    put(old, 1, "b")
    running = old.get_batch(1, now=0)
    _, _, fences = old.take_moving(to_new, now=0)
    new.fence_from(0, fences[1])
    later = put(new, 1, "b")
    assert old.expire(now=LEASE_TIMEOUT_S + 1) == 1 and old.lease(running.lease_id) is None
    assert old.keys_present({"b"}) == {"b"}  # the retry waits here: the fence stays
    assert new.get_batch(10, now=LEASE_TIMEOUT_S + 1) is None
    retry = old.get_batch(1, now=1000.0)
    old.settle(retry.lease_id, done=1, now=1000.0)
    new.unfence_from(0, {"b"} - old.keys_present({"b"}))
    assert seqs(new.get_batch(10, now=1000.0)) == later


def test_a_key_fenced_here_with_no_message_here_is_fenced_where_it_goes_next():
    """It moved here while it ran in queue 2 and moves on before that ends: its next queue
    waits for this one, which waits for queue 2."""
    core = make_core()
    core.fence_from(2, {"b", "c"})
    leases, _, fences = core.take_moving(to_new, now=0, key_dest=lambda key: 1 if key in MOVED else None)
    assert leases == {} and fences == {1: {"b"}}
    assert core.keys_present({"b"}) == {"b"}


def test_delayed_messages_move_with_the_time_left_until_they_are_due():
    core = make_core()
    chunk = core.new_chunk(1, key="d")
    core.put(chunk, now=0, not_before=10.0)
    leases, delays, _ = core.take_moving(to_new, now=4.0)
    assert delays[1] == [6.0]
    core.drop_moved(leases[1].lease_id)
    assert core.stats().delayed == 0 and core.next_wakeup() is None


def test_a_move_that_failed_gives_the_messages_back_in_their_places():
    core = make_core()
    b = put(core, 2, "b")
    chunk = core.new_chunk(1, key="d")
    core.put(chunk, now=0, not_before=10.0)
    leases, delays, _ = core.take_moving(to_new, now=4.0)
    core.return_moved(leases[1].lease_id, delays[1], now=4.0)
    assert seqs(core.get_batch(10, now=4.0)) == b[:1]  # ready, first again
    assert core.stats().delayed == 1  # the delayed one still waits for its due time
    assert core.get_batch(10, now=9.0) is None
    assert seqs(core.get_batch(10, now=10.5)) == [chunk.base_seq]


def test_a_fenced_key_waits_and_other_keys_do_not():
    core = make_core()
    core.fence({"b"})
    b = put(core, 1, "b")
    c = put(core, 1, "c")
    assert seqs(core.get_batch(10, now=0)) == c
    core.unfence({"b"})
    assert seqs(core.get_batch(10, now=0)) == b


def test_fences_go_with_a_hand_off():
    old = make_core()
    old.fence({"b"})
    put(old, 1, "b")
    new = make_core()
    new.import_state(old.export_state(now=0), now=0)
    assert new.get_batch(10, now=0) is None and new.fenced == {"b"}


def test_removing_a_queue_moves_unkeyed_messages_too():
    core = make_core()
    free = put(core, 4, None)
    leases, _, _ = core.take_moving(lambda chunk: 7, now=0)
    assert seqs(leases[7]) == free


@settings(max_examples=MOVE_EXAMPLES, deadline=None)
@given(
    st.lists(st.one_of(
        st.tuples(st.just("put"), st.sampled_from(["a", "b", "c", "d"]), st.integers(1, 3)),
        st.tuples(st.just("get"), st.integers(0, 1), st.integers(1, 4)),
        st.tuples(st.just("settle"), st.integers(0, 9), st.sampled_from(["ack", "fail", "release"])),
        st.tuples(st.just("tick"),),
        st.tuples(st.just("expire"), st.integers(0, 1)),
    ), max_size=60),
    st.integers(0, 60),
)
@example([("put", "b", 2), ("get", 0, 1), ("get", 1, 4)], 2)
@example([("put", "b", 2), ("get", 0, 1), ("put", "b", 1), ("settle", 0, "release"), ("get", 1, 4)], 2)
# A moved key whose only message here runs at the move: nothing of it moves, yet its new
# queue must fence it (found by Hypothesis).
@example([("put", "a", 1)] + [("tick",)] * 4 + [("put", "a", 1)] * 4
         + [("put", "b", 1), ("tick",), ("put", "a", 1), ("get", 0, 2), ("put", "b", 1), ("get", 1, 1)], 13)
def test_across_a_move_each_key_runs_one_at_a_time_in_put_order(ops, move_at):
    """Two queues; at step ``move_at`` keys b and d move from queue 0 to queue 1 (later puts
    of them go to 1), and queue 1 unfences a key once queue 0 has none of its messages, as
    the actor's fence check does."""
    cores = [make_core(max_retries=5), make_core(max_retries=5)]
    now = 0.0
    order: dict[tuple[int, int], int] = {}  # (queue, seq) -> the message's put number
    key_of: dict[int, str] = {}  # put number -> key
    leases: list[tuple[int, object]] = []
    completed: dict[str, list[int]] = {}
    moved = False
    n_put = 0

    def home(key: str) -> int:
        return 1 if moved and key in MOVED else 0

    for step, op in enumerate(ops + [("tick",)]):
        if step == move_at and not moved:
            moved = True
            taken, _, fences = cores[0].take_moving(to_new, now=now, key_dest=key_to_new)
            cores[1].fence_from(0, fences.get(1, ()))  # also when nothing of a key moved
            if 1 in taken:
                for span in taken[1].spans:
                    chunk = cores[1].new_chunk(span.count, key=span.chunk.key)
                    cores[1].put(chunk, now=now)
                    for k in range(span.count):
                        order[(1, chunk.base_seq + k)] = order[(0, span.first_seq + k)]
                cores[0].drop_moved(taken[1].lease_id)
        if op[0] == "put":
            q = home(op[1])
            for s in put(cores[q], op[2], op[1]):
                order[(q, s)] = n_put
                key_of[n_put] = op[1]
                n_put += 1
        elif op[0] == "get":
            lease = cores[op[1]].get_batch(op[2], now=now)
            if lease is not None:
                leases.append((op[1], lease))
        elif op[0] == "tick":
            now += 100.0
        elif op[0] == "settle" and leases:
            q, lease = leases.pop(op[1] % len(leases))
            if op[2] == "ack":
                cores[q].settle(lease.lease_id, done=lease.count, now=now)
                for s in seqs(lease):
                    completed.setdefault(key_of[order[(q, s)]], []).append(order[(q, s)])
            elif op[2] == "fail":
                cores[q].settle(lease.lease_id, done=lease.count,
                                errors=dict.fromkeys(range(lease.count), ERROR), now=now)
            else:
                cores[q].settle(lease.lease_id, done=0, now=now)
        elif op[0] == "expire":  # the sweeper: a lease not settled in time is retried
            cores[op[1]].expire(now=now)
            leases = [(q, lease) for q, lease in leases if cores[q].lease(lease.lease_id) is not None]
        fenced = cores[1].fences.held_by(0)
        if fenced:
            cores[1].unfence_from(0, fenced - cores[0].keys_present(fenced))
        running = [key_of[order[(q, s)]] for q, lease in leases for s in seqs(lease)]
        assert len(running) == len(set(running)), "two messages of one key at once"
    for key, done in completed.items():
        assert done == sorted(done), f"key {key} completed out of put order"


async def test_a_move_whose_last_write_fails_still_returns_the_new_ids_of_what_moved(tmp_path, monkeypatch):
    """The destination stored the messages and the source dropped them; a full disk at the
    source's last write must not swallow the old -> new id mapping (the client would get
    outcomes under ids it never handed out)."""
    from daskqueue import DurableQueue
    from daskqueue.errors import StoreError
    from tests.queue.test_handoff import _raw_blob

    source, dest = DurableQueue(0, str(tmp_path / "a")), DurableQueue(1, str(tmp_path / "b"))
    await source.set_peers([source, dest])  # off a worker a peer is the object itself
    await source.put_batch(_raw_blob([1, 2, 3]))
    adopted = []
    adopt = dest.adopt

    async def adopt_and_note(*args):
        adopted.append(await adopt(*args))
        return adopted[-1]

    write = source._after_change

    def full_disk_once_adopted(now):
        if adopted and adopted[-1] != "failed":
            adopted.append("failed")
            raise StoreError("no space left on device")
        write(now)

    monkeypatch.setattr(dest, "adopt", adopt_and_note)
    monkeypatch.setattr(source, "_after_change", full_disk_once_adopted)
    moved, failed = await source.move_out([1], everything=True)  # queue 0 is being removed

    assert "failed" in adopted  # the write after the destination took them did fail
    assert (moved, failed) == ([(0, 3, 1, 0)], [])
    assert ((await source.stats()).ready, (await dest.stats()).ready) == (0, 3)
    monkeypatch.undo()
    await source.close()  # the records the failed write left pending go out here
    await dest.close()
    reopened = DurableQueue(0, str(tmp_path / "a"))
    assert (await reopened.stats()).pending == 0
    await reopened.close()
