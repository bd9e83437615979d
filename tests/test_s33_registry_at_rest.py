"""An attached producer of a pool that ``adapt`` let rest (its last worker retired, the queues'
states parked in the owner's client): the registry lists the queues as resting, and a put
through the attached handle waits for them, asking the cluster for a worker as the owner's
calls do, and lands once the owner starts the queue there.

Before: the registry named the freed actors, the put found them released and the handle
dropped the queue as "removed by its owner" for good."""

from __future__ import annotations

import pytest
from distributed import Client

from daskqueue import QueuePool, registry
from tests import tasks
from tests.helpers import wait_until

#: adapt() every 0.2 s; a worker is retired after 3 looks that want it gone (~0.6 s).
ADAPT = dict(interval="200ms", wait_count=3)


def n_workers(client):
    return len(client.scheduler_info(n_workers=-1)["workers"])


@pytest.mark.timeout(120)
def test_an_attached_put_wakes_a_pool_that_adapt_let_rest(cluster_factory):
    cluster, client = cluster_factory(1)
    qp = QueuePool(client, 1)
    cluster.adapt(minimum=0, maximum=1, **ADAPT)
    wait_until(lambda: n_workers(client) == 0, timeout_s=30, interval_s=0.1)
    assert qp.table.resting == {0}

    with Client(cluster, set_as_default=False) as other:
        ah = QueuePool.attach(other, qp.name)
        try:
            ah.submit(tasks.double, 2)  # waits for the queue: its ask for a worker starts one
            assert n_workers(client) == 1
            assert qp.stats()[0].pending == 1
            assert 0 not in ah.table.removed
            assert not registry.registered_pool(client, qp.name).get("resting")
        finally:
            ah.close()
    qp.close()


@pytest.mark.timeout(120)
def test_an_attached_call_to_a_retired_workers_queue_goes_where_the_queue_moved(cluster_factory):
    """The worker retired (its queue handed off first) and is gone: a call through the
    handle's old actor cannot reach it. The queue moved, it was not lost."""
    cluster, client = cluster_factory(2)
    qp = QueuePool(client, 1)
    with Client(cluster, set_as_default=False) as other:
        ah = QueuePool.attach(other, qp.name)
        try:
            old = qp.queues[0]._address
            client.retire_workers([old])
            wait_until(lambda: n_workers(client) == 1 and qp.queues[0]._address != old, timeout_s=30)
            assert ah.table.handles[0]._address == old  # not followed yet
            # before: QueueLostError "... lost with its worker ...; 1 of its transient messages ..."
            ah.submit(tasks.double, 2)
            assert qp.stats()[0].pending == 1
            assert ah.table.handles[0]._address == qp.queues[0]._address
        finally:
            ah.close()
    qp.close()
