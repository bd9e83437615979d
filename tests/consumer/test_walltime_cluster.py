"""Walltime-aware consumers on a real cluster: a worker with a lifetime (``--lifetime``, as
dask-jobqueue starts them) stops taking work it cannot finish before it leaves, its queue is
handed off when it retires, and no task runs twice or is lost."""

from __future__ import annotations

import asyncio
import copy
import functools
import os

import psutil
import pytest

from daskqueue import ConsumerPool, QueuePool, defaults
from daskqueue.consumer.leaving import lifetime_timer
from tests import walltime_tasks

TASK_S = 2.5
MARGIN_S = 0.25  # the consumers keep defaults.WALLTIME_MARGIN_S (2 s); most of it is slack for a loaded machine (1 s of it was eaten at load 17)
#: The leaving worker's lifetime, counted from when its consumer starts (see _lifetime_from_now).
LIFETIME_S = 10.0


@pytest.fixture
def lifetime_worker(cluster_factory):
    """A cluster of two plain workers, plus one named "leaving" with a ``lifetime`` (as
    dask-jobqueue starts its workers with ``--lifetime``; a lifetime no setup outlasts: the
    test moves its end, see ``_lifetime_from_now``). It is added to the cluster's spec, so
    that its worker process forks from the suite's warm forkserver (a ``dask worker``
    process and the worker it spawns imported Dask twice: ~5 s of the test's start on a
    loaded machine); nothing restarts it once it leaves (the cluster only starts workers
    when it is scaled).

    Two plain ones, not one: the work left when the leaving one stops runs on both, half the
    test's time (the leaving one's share, and so what the test checks, stays the same)."""
    cluster, client = cluster_factory(2)
    spec = copy.deepcopy(cluster.new_spec)
    spec["options"].update(name="leaving", lifetime="600s")
    cluster.worker_spec["leaving"] = spec
    cluster.sync(cluster._correct_state)
    client.wait_for_workers(3, timeout=60)
    return cluster, client


@pytest.mark.timeout(240)
def test_a_worker_reaching_its_lifetime_takes_no_task_it_cannot_finish(lifetime_worker, tmp_path, monkeypatch):
    # Consumers on a retiring worker are let go after this: a task still running then is cut
    # off and runs again elsewhere (as one longer than the default 12 s would be, or any at a
    # SLURM job's hard end). So nothing may be running when the worker's lifetime ends.
    monkeypatch.setattr(defaults, "RETIRE_STOP_TIMEOUT_S", 0.5)
    cluster, client = lifetime_worker
    leaving = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "leaving")
    worker = psutil.Process(client.run(os.getpid, workers=[leaving])[leaving])
    qp = QueuePool(client, 2)  # transient: only a graceful hand-off keeps the leaving one's messages
    cp = ConsumerPool(client, qp)
    # The lifetime ends LIFETIME_S after this, as the consumers (they read it as they start)
    # will see: counted from the worker's start, on a loaded machine the setup took all of a
    # 12 s lifetime, or left so little of it that the leaving worker's first task (of unknown
    # length: it may start until the margin) ran across its end.
    ends_at = client.run(_lifetime_from_now, LIFETIME_S, workers=[leaving])[leaving]
    assert ends_at is not None
    cp.start()
    # The leaving worker's processes (the worker, a consumer's child process).
    leaving_pids = {worker.pid} | {p.pid for p in worker.children(recursive=True)}
    log = tmp_path / "runs.log"
    # Without the walltime, the leaving worker is always in the middle of a 2.5 s task when
    # its lifetime ends (the work outlasts it); with it, it runs its last one to its end well
    # before (one task of unknown length first, then those its estimate, 3.75 s, says end
    # 2 s before it leaves). 13 tasks: with 3 workers, about 4 still wait when it stops.
    n = 13
    out = qp.map(walltime_tasks.logged_run, [(i, TASK_S, str(log)) for i in range(n)], timeout_s=150)

    assert out == list(range(n))
    assert cp.failures() == {}
    worker.wait(timeout=30)  # it left, as its lifetime said
    assert leaving not in client.scheduler_info()["workers"]
    starts = walltime_tasks.starts(log)
    assert sorted(starts) == list(range(n))
    assert all(c == 1 for c in starts.values()), {x: c for x, c in starts.items() if c > 1}
    assert all(s.total_worker_lost == 0 and s.total_expired == 0 for s in qp.stats())
    # The leaving worker ran tasks, and its last one ended before its lifetime did (without the
    # walltime guard, one ran across it: cut off, or finished during the retirement).
    last = walltime_tasks.last_end(log, leaving_pids)
    assert last is not None and last <= ends_at - MARGIN_S, (last, ends_at)
    cp.close()
    qp.close()


async def _lifetime_from_now(seconds, dask_worker):
    """Dask's lifetime close of this worker moved to ``seconds`` from now, scheduled as
    ``Worker.__init__`` schedules it (reading it off that timer is tests/consumer/test_leaving.py's
    test); when it comes now, read as the consumers read it."""
    for handle in list(asyncio.get_running_loop()._scheduled):  # noqa: SLF001
        if any(isinstance(arg, functools.partial) and arg.func == dask_worker.close_gracefully
               for arg in getattr(handle, "_args", None) or ()):
            handle.cancel()
    dask_worker.io_loop.call_later(seconds, dask_worker.close_gracefully, reason="worker-lifetime-reached")
    return lifetime_timer(dask_worker)
