"""A consumer pool made after one of its queue pool's queues was lost tells its first
consumers the workers the queues were lost with (``lost_addresses()``), as it tells the
consumers it adds later (``Members.add``): a consumer whose home is the lost queue then
skips it at once, instead of long-polling it until its call's deadline (20 s).

``start()`` asks the scheduler which workers are gone and tells the consumers (stop 32), but
a worker restarted on the address it died with (a fixed ``worker_port``, as on batch
systems) is not gone to the scheduler, while the queue that was there is: a call to it is
never answered (the new worker has no such actor). The nanny restarts the killed worker
there."""

from __future__ import annotations

import time

import pytest

from daskqueue import ConsumerPool, QueuePool
from daskqueue.errors import QueueLostError
from daskqueue.messages import split_id
from tests import tasks
from tests.helpers import kill_worker, wait_until

#: Well under the 20 s a poll of the dead queue waits when its consumer was not told.
BOUND_S = 8.0



def _submit_to_the_survivor(qp) -> int:
    """Submit ``double(21)`` until it lands on queue 1 (one to the lost queue 0 raises)."""
    for _ in range(8):
        try:
            task_id = qp.submit(tasks.double, 21)
        except QueueLostError:
            continue
        if split_id(task_id)[0] == 1:
            return task_id
    raise AssertionError("no submit went to queue 1")


@pytest.mark.timeout(90)
def test_the_first_consumers_of_a_pool_made_after_a_queue_was_lost_skip_it_at_once(fixed_port_client):
    client = fixed_port_client
    qp = QueuePool(client, 2)
    victim = qp.queues[0]._address  # queue 0 is consumer 0's home
    kill_worker(client, victim)
    wait_until(lambda: victim in qp.lost_addresses(), timeout_s=30)
    wait_until(lambda: victim in client.run(lambda: 0), timeout_s=30)  # back, on its address
    cp = ConsumerPool(client, qp, n_consumers=1, isolation="thread")
    try:
        cp.start()
        started = time.monotonic()
        task_id = _submit_to_the_survivor(qp)
        assert qp.result(task_id, timeout_s=60) == 42
        took = time.monotonic() - started
        assert took < BOUND_S, f"the task on the surviving queue took {took:.1f} s"
    finally:
        cp.close()
        qp.close()
