"""The scheduler dies: a real ``dask scheduler`` process and real ``dask worker`` processes
(a ``LocalCluster`` runs its scheduler inside the test process, which cannot be killed alone);
the session cluster then recovers the durable pool."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from distributed import Client

from daskqueue import ConsumerPool, QueuePool, membership
from daskqueue.errors import SchedulerLostError
from daskqueue.queue.directory import queue_dir
from daskqueue.segment.lockfile import DirectoryLock
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


#: Shorter than the library's 5 s: how long the client may be reconnecting before the
#: pools call the scheduler lost. The test proves the loss is typed and noticed, not the
#: length of the grace period.
SCHEDULER_LOST_S = 1.0


def test_losing_the_scheduler_raises_a_typed_error_soon_and_a_new_cluster_recovers_the_durable_pool(
    processes, tmp_path, client, monkeypatch
):
    """``client`` (the session cluster) is the new cluster that recovers the pool."""
    monkeypatch.setattr(membership, "SCHEDULER_LOST_S", SCHEDULER_LOST_S)
    address = f"tcp://127.0.0.1:{_free_port()}"
    scheduler = processes("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                          address.rsplit(":", 1)[1], "--dashboard-address", ":0")
    for _ in range(2):
        processes("distributed.cli.dask_worker", address, "--nthreads", "1", "--no-dashboard")
    lost_client = Client(address, timeout=60)
    try:
        lost_client.wait_for_workers(2, timeout=60)
        qp = QueuePool(lost_client, 2, durability="durable", dirpath=tmp_path / "pool")
        # Threads: where user code runs plays no part here, and children take seconds to start.
        cp = ConsumerPool(lost_client, qp, isolation="thread")
        cp.start()
        # 3 s of work for the 2 consumers: most of it still waits when the scheduler dies
        # (its workers close at once, so nothing runs after the kill).
        ids = qp.batch_submit([(tasks.sleep_then, i, 0.01) for i in range(600)])
        wait_until(lambda: sum(s.total_acked for s in qp.stats()) > 50)
        scheduler.kill()
        killed_at = time.monotonic()

        with pytest.raises(SchedulerLostError, match="dirpath") as info:
            cp.join(timeout=120)
        assert time.monotonic() - killed_at < 30
        assert info.value.dirpath == qp.dirpath
        with pytest.raises(SchedulerLostError):
            qp.stats()
        fetched = dict(qp._collector.results)  # what reached this client before the loss
        assert len(fetched) < len(ids)
    finally:
        lost_client.close(timeout=5)
    # Closing pools whose scheduler is gone tells no actor (no call can reach them), so it
    # does not wait out STOP_TIMEOUT_S (25 s) per pool.
    started = time.monotonic()
    cp.close()
    qp.close()
    assert time.monotonic() - started < 5

    # The old workers close once their scheduler is gone, and their queue actors' locks go
    # with them: within seconds, but on a loaded machine (the suite's processes on 2 cores)
    # later than the LOCK_WAIT_S a new queue actor waits for a lock. Waited for here.
    for q in range(2):
        DirectoryLock(queue_dir(str(tmp_path / "pool"), q), 0o600, wait_s=60).release()

    # Every message is on disk: a new cluster finishes the work, with one outcome per task.
    qp2 = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "pool")
    try:
        cp2 = ConsumerPool(client, qp2, isolation="thread")
        cp2.start()
        cp2.join(timeout=120)
        later = cp2.results()
        # Results the old client had fetched may come again (the queue drops a fetched
        # record when the next fetch confirms it): the same values.
        assert all(later[i] == fetched[i] for i in fetched.keys() & later.keys())
        assert sorted({**fetched, **later}[i] for i in ids) == list(range(600))
        assert cp2.failures() == {}
        cp2.close()
    finally:
        qp2.close()
