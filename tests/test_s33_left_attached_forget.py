"""An attached handle that learns its owner removed a queue drops its long poll in flight
there, as the owner's ``remove_queue`` does (``ResultCollector.forget``): a handle that goes
on only putting never polls again, so nothing else would drop it. The task it had put
there still gives its outcome under its id (the owner moved it and forwarded the records).
On the shared cluster."""

from __future__ import annotations

import time

import pytest

from daskqueue import QueuePool
from daskqueue.messages import split_id
from daskqueue.queue.attached_follow import FOLLOW_S
from tests import tasks


def _submit_until_on(pool, q: int) -> tuple[int, int]:
    """Submit ``double(x)`` calls until one lands on queue ``q``; its id and ``x`` (each
    small send primes a long poll at its queue)."""
    for x in range(64):
        task_id = pool.submit(tasks.double, x)
        if split_id(task_id)[0] == q:
            return task_id, x
    raise AssertionError(f"no submit went to queue {q}")


@pytest.mark.timeout(60)
def test_an_attached_handle_drops_its_long_poll_of_a_queue_the_owner_removed(client, pools):
    qp = pools.queue(3, name="s33-left-forget")
    cp = pools.consumer(qp, isolation="thread")  # not started: the task waits at its queue
    attached = QueuePool.attach(client, "s33-left-forget")
    try:
        waiting, x = _submit_until_on(attached, 2)
        assert 2 in attached.collector._long  # the poll a small send primes (outcome_polls.prime)

        qp.remove_queue(2, timeout_s=30)  # its waiting task moves to queue 0 or 1
        time.sleep(FOLLOW_S)  # the handle reads its pool's registry entry at most this often
        attached.submit(tasks.double, 100)  # a put follows the entry: queue 2 is removed

        assert 2 in attached.table.removed and 2 in attached.collector.removed
        assert 2 not in attached.collector._long, "a long poll to the removed queue stayed in flight"
        cp.start()
        assert attached.result(waiting, timeout_s=20) == 2 * x  # it moved, and kept its id
    finally:
        attached.close()
