"""Waiting on a condition instead of sleeping a fixed time (every wait has a timeout), killing
workers, and worker jobs in process groups of their own."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import time
from typing import Any, Awaitable, Callable


def wait_until(predicate: Callable[[], Any], *, timeout_s: float = 30.0, interval_s: float = 0.01) -> None:
    """Call ``predicate`` every ``interval_s`` until it is true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout_s} s: {_describe(predicate)}")
        time.sleep(interval_s)


async def wait_until_async(
    predicate: Callable[[], Any | Awaitable[Any]], *, timeout_s: float = 30.0, interval_s: float = 0.01
) -> None:
    """``wait_until`` on the running event loop: sleeps with ``asyncio.sleep`` (other tasks
    run meanwhile); ``predicate`` may be a plain or an async function."""
    deadline = time.monotonic() + timeout_s
    while not await _truth(predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout_s} s: {_describe(predicate)}")
        await asyncio.sleep(interval_s)


async def _truth(value: Any) -> bool:
    return bool(await value) if inspect.isawaitable(value) else bool(value)


def _describe(predicate: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)


def kill_worker(client: Any, address: str) -> None:
    """SIGKILL the process of the worker at ``address``, as the OOM killer or preemption would."""
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)


#: The repository's root: the working directory and import path of the processes tests start.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def root_env() -> dict[str, str]:
    """This environment, with the repository first on ``PYTHONPATH`` (a process started from
    a test imports this tree's daskqueue and tests)."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


class WorkerJobs:
    """``dask worker`` jobs beside fresh in-process schedulers: each job is a nanny and its
    worker in a process group of their own, as one batch job is, so that killing the group
    (as ``scancel`` does) leaves nothing to restart the worker (a ``LocalCluster``'s nanny
    would). ``start(n)`` -> ``(client, [Popen])``; ``close()`` kills every job still alive
    and closes the schedulers and clients."""

    def __init__(self, *, wait_s: float = 120.0) -> None:
        self.wait_s = wait_s
        self._made: list[tuple[Any, Any, list[subprocess.Popen]]] = []

    def start(self, n: int) -> tuple[Any, list[subprocess.Popen]]:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=0, dashboard_address=":0", host="127.0.0.1")
        client = Client(cluster)
        procs = [
            subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
                              "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"],
                             cwd=ROOT, env=root_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
            for _ in range(n)
        ]
        self._made.append((cluster, client, procs))
        client.wait_for_workers(n, timeout=self.wait_s)
        return client, procs

    def close(self) -> None:
        for cluster, client, procs in reversed(self._made):
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
            client.close(timeout=10)
            cluster.close(timeout=10)
        self._made.clear()


def job_of(client: Any, procs: list[subprocess.Popen], address: str) -> subprocess.Popen:
    """The job (of ``WorkerJobs``: nanny and worker, one process group) of the worker at ``address``."""
    pid = client.run(os.getpid, workers=[address])[address]
    [job] = [p for p in procs if p.pid == os.getpgid(pid)]
    return job


def lane_servers(client: Any) -> int:
    """How many queue actors on the cluster's workers serve a lane now."""
    def count(dask_worker):  # type: ignore[no-untyped-def]
        return sum(getattr(a, "_lane_server", None) is not None for a in dask_worker.state.actors.values())

    return sum(client.run(count).values())
