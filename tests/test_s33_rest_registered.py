"""A durable queue lost with its worker while no other worker can take it rests in the owner's
client until one joins; the registry says so (``resting``), as it does for a queue parked
after a hand-off. Before, the entry kept naming the dead actor, and an attached handle that
read it retried the dead worker and gave up instead of waiting for the queue. The worker is a
``dask worker`` job killed as a batch system does (nothing restarts it)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from daskqueue import QueuePool, registry
from tests import tasks
from tests.helpers import job_of, wait_until


@pytest.mark.timeout(120)
def test_a_durable_queue_lost_with_no_worker_left_is_registered_resting_and_an_attached_put_waits_for_it(
        jobs, tmp_path):  # noqa: F811
    client, procs = jobs(1)
    qp = QueuePool(client, 1, durability="durable", dirpath=tmp_path / "pool", name="s33-rest-registered")
    try:
        attached = QueuePool.attach(client, qp.name)
        assert len(attached.batch_submit([(tasks.double, 1)])) == 1
        os.killpg(job_of(client, procs, qp.queues[0]._address).pid, signal.SIGKILL)
        wait_until(lambda: 0 in qp.table.resting, timeout_s=30)

        entry = registry.registered_pool(client, qp.name)
        assert list(entry["resting"]) == [0] and "0" not in entry["queues"]  # before: the dead actor

        got: list = []
        put = threading.Thread(target=lambda: got.append(attached.batch_submit([(tasks.double, 2)])), daemon=True)
        put.start()
        put.join(2.0)
        assert put.is_alive() and not got  # it waits for the queue (and asks for a worker)
        client.cluster.scale(1)
        put.join(60)
        assert got and len(got[0]) == 1
        wait_until(lambda: 0 not in qp.table.resting, timeout_s=30)
        assert qp.stats(timeout_s=10)[0].pending == 2  # both puts, the first from the directory
        attached.close()
    finally:
        qp.close()
