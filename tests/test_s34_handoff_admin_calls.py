"""Dead-letter replay, purge, and the last outcome reads of ``remove_queue`` follow a queue
that moved between their lookup and their call, as puts and polls do.

Each looked its queue's actor up, then called it and read the answer: a queue handed off
in between (its worker retiring) answers from its old actor with ``QueueHandedOffError``
(nothing of the call done), or, once that actor is freed, is found released (the same,
to the pool). They raised that to the user; now they make the call again where the queue is.

The hand-off is the pool's own (``Follower.hand_off``, what a retirement runs), made inside
the call, between its lookup and its send: the old handle stands for a lookup made before
the move (its own hold on the key, released with the actor, is not looked at)."""

from __future__ import annotations

import pytest

from daskqueue.queue.table import Pending
from tests import tasks
from tests.helpers import wait_until


def _moves_under_the_first(qp, method):
    """Make the first call of ``method`` to a queue move that queue (a real hand-off) after
    the call looked its actor up and before the call is sent; the queues moved so."""
    table = qp.table
    call = table.call
    moved = []

    def looked_up_then_moved(q, name, *args):
        if name != method or moved:
            return call(q, name, *args)
        handle = table.current(q)  # the lookup
        qp.follower.hand_off(q)  # the move: the queue's worker retires
        assert table.handles[q] is not handle and q not in table.moving
        moved.append(q)
        handle.__dict__["_future"] = None
        return Pending(getattr(handle, name)(*args), handle, name, args)  # the call, to the old actor

    table.call = looked_up_then_moved
    return moved


@pytest.mark.timeout(90)
def test_a_purge_follows_a_queue_handed_off_under_it(pools):
    qp = pools.queue(1)
    qp.batch_submit([(tasks.double, i) for i in range(100)])
    moved = _moves_under_the_first(qp, "purge")
    assert qp.purge(dead=False, ready=True) == {"dead": 0, "ready": 100}  # before: QueueHandedOffError
    assert moved == [0]
    assert qp.table.ask(0, "stats").pending == 0


@pytest.mark.timeout(120)
def test_a_dead_letter_replay_follows_a_queue_handed_off_under_it(pools):
    qp = pools.queue(1, max_retries=0)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    ids = qp.batch_submit([(tasks.boom, i) for i in range(3)])
    cp.join(timeout=60)
    cp.close()  # the replayed letters wait, to be counted
    assert sorted(d.task_id for d in qp.dead_letters()) == sorted(ids)
    moved = _moves_under_the_first(qp, "replay_dead")
    assert qp.replay_dead(ids) == 3  # before: QueueHandedOffError
    assert moved == [0]
    s = qp.table.ask(0, "stats")
    assert (s.ready, s.dead) == (3, 0)


@pytest.mark.timeout(120)
def test_reading_every_outcome_of_a_queue_follows_it_when_it_was_handed_off_under_the_read(pools):
    """``fetch_all``: what ``remove_queue`` reads before and after it closes the queue."""
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    ids = qp.batch_submit([(tasks.double, i) for i in range(20)])
    wait_until(lambda: qp.table.ask(0, "stats").total_acked == 20, timeout_s=60)
    moved = _moves_under_the_first(qp, "fetch_outcomes")
    qp.collector.fetch_all(0)  # before: QueueHandedOffError
    assert moved == [0]
    assert [qp.result(i, timeout_s=30) for i in ids] == [2 * i for i in range(20)]
