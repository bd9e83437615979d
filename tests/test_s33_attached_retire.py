"""A pool attached by name holds no reference on its queues' actors: the owner frees the old
actor of a queue that moved off a retiring worker, and Dask retires that worker. Before,
the attached handle's Future kept the actor, and ``retire_workers`` refused the worker
("it holds actor(s) ... which can't be moved"), after a 20 s wait: an adaptive cluster with an
attached producer could not scale down, and a SLURM job could not leave before its walltime."""

from __future__ import annotations

import pytest

from daskqueue import ConsumerPool, QueuePool
from tests import tasks


@pytest.mark.timeout(120)
def test_a_queues_worker_retires_though_a_pool_attached_by_name_used_that_queue(cluster_factory):
    cluster, client = cluster_factory(3)
    qp = QueuePool(client, 1, name="s33-attached-retire")
    cp = ConsumerPool(client, qp, n_consumers=2, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "s33-attached-retire")
    assert attached.map(tasks.double, [1, 2]) == [2, 4]
    victim = qp.queues[0]._address

    retired = client.retire_workers([victim])

    assert list(retired) == [victim]
    assert qp.queues[0]._address != victim
    # Both follow the queue to its successor.
    assert attached.map(tasks.double, [3, 4], timeout_s=60) == [6, 8]
    assert qp.map(tasks.double, [5], timeout_s=60) == [10]
    attached.close()
    cp.close()
    qp.close()
