"""The scheduler dies: a real ``dask scheduler`` process and real ``dask worker`` processes
(a ``LocalCluster`` runs its scheduler inside the test process, which cannot be killed alone)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from distributed import Client, LocalCluster

from daskqueue import ConsumerPool, QueuePool
from daskqueue.errors import SchedulerLostError
from tests import tasks
from tests.helpers import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def start(*args: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait(timeout=30)


def test_losing_the_scheduler_raises_a_typed_error_soon_and_a_new_cluster_recovers_the_durable_pool(
    processes, tmp_path
):
    address = f"tcp://127.0.0.1:{_free_port()}"
    scheduler = processes("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                          address.rsplit(":", 1)[1], "--dashboard-address", ":0")
    for _ in range(2):
        processes("distributed.cli.dask_worker", address, "--nthreads", "1", "--no-dashboard")
    client = Client(address, timeout=60)
    try:
        client.wait_for_workers(2, timeout=60)
        qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "pool")
        cp = ConsumerPool(client, qp)
        cp.start()
        ids = qp.batch_submit([(tasks.sleep_then, i, 0.01) for i in range(2000)])
        wait_until(lambda: sum(s.total_acked for s in qp.stats()) > 100)
        scheduler.kill()
        killed_at = time.monotonic()

        with pytest.raises(SchedulerLostError, match="dirpath") as info:
            cp.join(timeout=120)
        assert time.monotonic() - killed_at < 30
        assert info.value.dirpath == qp.dirpath
        with pytest.raises(SchedulerLostError):
            qp.stats()
        fetched = dict(qp._collector.results)  # what reached this client before the loss
        cp.close()
        qp.close()
    finally:
        client.close(timeout=5)

    # Every message is on disk: a new cluster finishes the work, with one outcome per task.
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client2:
        qp2 = QueuePool(client2, 2, durability="durable", dirpath=tmp_path / "pool")
        cp2 = ConsumerPool(client2, qp2)
        cp2.start()
        cp2.join(timeout=120)
        later = cp2.results()
        # Results the old client had fetched may come again (the queue drops a fetched
        # record when the next fetch confirms it): the same values.
        assert all(later[i] == fetched[i] for i in fetched.keys() & later.keys())
        assert sorted({**fetched, **later}[i] for i in ids) == list(range(2000))
        assert cp2.failures() == {}
        cp2.close()
        qp2.close()
