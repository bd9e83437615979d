"""A consumer told that a worker was lost skips that worker's queues; a queue placed on the
same address later, once the worker was restarted there (its nanny, on a fixed port, as on
batch systems), is served like any other.

``QueueCalls.move`` (a queue reopened or handed off onto that address) took the address
back, but ``replace`` (the pool's queues changed: ``add_queues``) did not: a queue added
on the restarted worker was skipped by every consumer told of the loss, and its tasks never
ran."""

from __future__ import annotations


import pytest

from daskqueue import ConsumerPool, QueuePool
from daskqueue.messages import split_id
from tests import tasks
from tests.helpers import kill_worker, wait_until



def _lost_workers_told(dask_worker):
    """The lost workers each consumer actor on this worker was told of."""
    return [sorted(a._calls._dead) for a in dask_worker.state.actors.values() if hasattr(a, "_calls")]


@pytest.mark.timeout(120)
def test_a_queue_added_on_a_worker_restarted_under_a_lost_address_is_served(fixed_port_client):
    client = fixed_port_client
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp, n_consumers=1, isolation="thread")
    try:
        cp.start()
        home = qp.queues[0]._address
        assert [m.address for m in cp.members.live()] == [home]
        victim = next(w for w in client.scheduler_info()["workers"] if w != home)
        kill_worker(client, victim)
        wait_until(lambda: client.run(_lost_workers_told, workers=[home])[home] == [[victim]], timeout_s=60)
        wait_until(lambda: victim in qp.membership.placeable(), timeout_s=60)  # back, on its address
        assert qp.add_queues(1) == [1]
        assert qp.queues[1]._address == victim
        ids = [qp.submit(tasks.double, i) for i in range(12)]
        assert any(split_id(i)[0] == 1 for i in ids)
        # Before: the tasks put to queue 1 never ran (its consumer skipped it as lost).
        assert [qp.result(i, timeout_s=20) for i in ids] == [2 * i for i in range(12)]
    finally:
        cp.close()
        qp.close()
