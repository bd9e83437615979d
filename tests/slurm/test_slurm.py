"""daskqueue on a real SLURM through ``dask_jobqueue.SLURMCluster(cores=1, processes=1)``: a map
on two jobs, a job cancelled (``scancel``) in the middle of a durable and of a transient map,
``adapt`` from zero jobs and back, and workers that reach their ``--lifetime``.

The node has 2 CPUs, so at most 2 one-core jobs run at once. Every wait is bounded (each test
has its own ``timeout``, well under the lane's 3 minutes in total)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import psutil
import pytest

from daskqueue import ConsumerPool, QueuePool
from daskqueue.errors import QueueLostError
from tests import tasks
from tests.slurm import work
from tests.helpers import wait_until
from tests.slurm.conftest import squeue_ids

pytestmark = pytest.mark.slurm

#: A job's worker joins within this (sbatch, scheduling, Python start-up on a busy 2-core box).
JOB_START_S = 90
#: What the issue promises for any call after a worker is lost: a typed error within this.
BOUND_S = 30.0


def two_jobs(slurm_cluster, **kwargs):
    cluster, client = slurm_cluster(**kwargs)
    cluster.scale(jobs=2)
    client.wait_for_workers(2, timeout=JOB_START_S)
    return cluster, client


def job_of(cluster, client, address):
    """The SLURM job id of the worker at ``address`` (processes=1: the worker is named as its job)."""
    name = client.scheduler_info()["workers"][address]["name"]
    return str(cluster.workers[name].job_id)


def log_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def runs(path):
    """Task -> how many times it ran (tasks.logged_sleep writes one line per run)."""
    counts: dict[int, int] = {}
    with open(path) as f:
        for line in f:
            x = int(line.split()[0])
            counts[x] = counts.get(x, 0) + 1
    return counts


def ran_on(path, pids):
    """The tasks that ran (at least once) in one of the processes ``pids``."""
    with open(path) as f:
        return {int(x) for x, _, _, p in (line.split() for line in f) if int(p) in pids}


def job_processes(pid):
    """``pid`` and its descendants now (a worker runs tasks in a child process next to a queue)."""
    try:
        proc = psutil.Process(pid)
        return {pid} | {child.pid for child in proc.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def scancel_when(log, n_lines, job_id, killed, worker_pid=None, victims=None):
    """A thread that cancels ``job_id`` once ``log`` has ``n_lines`` task runs; it never touches
    the pools (a QueuePool is used from one thread at a time). ``killed`` gets the time;
    ``victims`` the processes of ``worker_pid`` (on this host) at the cancel."""

    def run():
        deadline = time.monotonic() + 60
        while log_lines(log) < n_lines and time.monotonic() < deadline:
            time.sleep(0.01)
        if worker_pid is not None:
            victims.update(job_processes(worker_pid))
        subprocess.run(["scancel", job_id], check=True, timeout=30)
        killed.append(time.monotonic())

    thread = threading.Thread(target=run, name="scancel", daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(150)
def test_a_map_of_a_few_thousand_noops_on_two_jobs_returns_results_in_order(slurm_cluster):
    cluster, client = two_jobs(slurm_cluster)
    qp = QueuePool(client, 2)
    cp = ConsumerPool(client, qp)
    cp.start()
    assert len({q._address for q in qp.queues}) == 2  # one queue per job
    started = time.monotonic()
    assert qp.map(tasks.double, range(5000), timeout_s=60) == [2 * i for i in range(5000)]
    assert time.monotonic() - started < 60
    assert cp.failures() == {}
    assert sum(s.items_done for s in cp.stats()) >= 5000
    cp.close()
    qp.close()


@pytest.mark.timeout(150)
def test_scancel_of_a_job_mid_durable_map_loses_and_repeats_nothing(slurm_cluster, tmp_path):
    """The README's shape on two jobs: 2 durable queues, the default ConsumerPool (one consumer
    per worker), a map; one job is cancelled in the middle and no job replaces it. The queue it
    held reopens on the surviving job from its directory and every task's result comes back
    once, in order."""
    cluster, client = two_jobs(slurm_cluster)
    qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "pool")
    cp = ConsumerPool(client, qp)
    cp.start()
    victim_address = qp.queues[1]._address
    victim = job_of(cluster, client, victim_address)
    victim_pid = client.run(os.getpid, workers=[victim_address])[victim_address]
    log = tmp_path / "runs.log"
    n = 2000
    killed: list[float] = []
    victims: set[int] = set()
    killer = scancel_when(log, 200, victim, killed, victim_pid, victims)

    out = qp.map(work.logged_sleep_5ms, [(i, str(log)) for i in range(n)], timeout_s=30)

    killer.join(timeout=30)
    assert killed, "the job was not cancelled"
    assert out == list(range(n))
    assert victim not in squeue_ids()
    assert qp.queues[1]._address != victim_address  # reopened on the surviving job
    counts = runs(log)
    assert sorted(counts) == list(range(n))
    # At least once: only what the cancelled job was running (or had fetched) runs again.
    again = {x for x, c in counts.items() if c > 1}
    assert again <= ran_on(log, victims), "a task that never ran on the cancelled job ran twice"
    assert cp.failures() == {}
    cp.close()
    qp.close()


@pytest.mark.timeout(150)
def test_scancel_of_a_job_mid_transient_map_raises_queue_lost_promptly(slurm_cluster, tmp_path):
    """The same with transient queues: the cancelled job's messages are gone, and the map says
    so with a QueueLostError within BOUND_S of the cancel (not a hang until its timeout)."""
    cluster, client = two_jobs(slurm_cluster)
    qp = QueuePool(client, 2)
    cp = ConsumerPool(client, qp)
    cp.start()
    victim = job_of(cluster, client, qp.queues[1]._address)
    log = tmp_path / "runs.log"
    killed: list[float] = []
    killer = scancel_when(log, 200, victim, killed)

    with pytest.raises(QueueLostError) as info:
        qp.map(work.logged_sleep_5ms, [(i, str(log)) for i in range(2000)], timeout_s=90)
    raised = time.monotonic()

    killer.join(timeout=30)
    assert killed, "the job was not cancelled"
    assert raised - killed[0] < BOUND_S, f"QueueLostError {raised - killed[0]:.1f} s after the scancel"
    assert info.value.queue_index == 1
    assert info.value.durability == "transient"
    cp.cancel()
    cp.close()
    qp.close()


@pytest.mark.timeout(150)
def test_pools_created_on_an_adaptive_cluster_at_zero_jobs_start_a_job(slurm_cluster):
    """``adapt(minimum_jobs=0)`` with no job yet: the pools record their demand, adapt submits
    a job, the actors are placed when its worker joins and the map runs."""
    cluster, client = slurm_cluster()
    cluster.adapt(minimum_jobs=0, maximum_jobs=2)
    assert not client.scheduler_info()["workers"]
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp)
    cp.start()
    assert qp.map(tasks.double, range(100), timeout_s=JOB_START_S) == [2 * i for i in range(100)]
    assert client.scheduler_info()["workers"]
    cp.close()
    qp.close()


@pytest.mark.timeout(150)
def test_an_idle_pool_lets_adapt_go_back_to_zero_jobs_and_up_again(slurm_cluster):
    """Started at one job (today's workaround for point 2), then ``minimum_jobs=0``: once the
    pool is idle, adapt retires the last job (no allocation held by an idle notebook) and a
    later map brings a job back."""
    cluster, client = slurm_cluster()
    cluster.adapt(minimum_jobs=1, maximum_jobs=2)
    client.wait_for_workers(1, timeout=JOB_START_S)
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp)
    cp.start()
    assert qp.map(tasks.double, range(100), timeout_s=60) == [2 * i for i in range(100)]

    cluster.adapt(minimum_jobs=0, maximum_jobs=2)
    # adapt retires an idle worker after a few 1 s intervals; then its job ends.
    wait_until(lambda: not client.scheduler_info()["workers"] and not squeue_ids(), timeout_s=20,
               interval_s=0.5)

    assert qp.map(tasks.double, range(100), timeout_s=JOB_START_S) == [2 * i for i in range(100)]
    cp.close()
    qp.close()


@pytest.mark.timeout(150)
def test_workers_reaching_their_lifetime_hand_a_transient_map_over_losing_nothing(slurm_cluster, tmp_path):
    """``--lifetime`` below the walltime: each job's worker retires after ~15 s, handing its
    queue to the other (or, when both leave together, to the client until a new job joins);
    adapt keeps 2 jobs. A transient map across the retirements loses nothing."""
    cluster, client = slurm_cluster(worker_extra_args=["--lifetime", "15s", "--lifetime-stagger", "2s"])
    cluster.adapt(minimum_jobs=2, maximum_jobs=2)
    client.wait_for_workers(2, timeout=JOB_START_S)
    qp = QueuePool(client, 2)  # transient: only a graceful hand-off keeps its messages
    cp = ConsumerPool(client, qp)
    cp.start()
    first = {q._address for q in qp.queues}
    log = tmp_path / "runs.log"
    n = 1600  # ~20 s of 25 ms tasks on 2 consumers: longer than a worker's lifetime

    out = qp.map(work.logged_sleep_25ms, [(i, str(log)) for i in range(n)], timeout_s=100)

    assert out == list(range(n))
    assert cp.failures() == {}
    assert first != {q._address for q in qp.queues}  # the queues moved off the retired workers
    assert all(s.total_worker_lost == 0 for s in qp.stats())
    counts = runs(log)
    assert sorted(counts) == list(range(n))
    assert all(c == 1 for c in counts.values()), {x: c for x, c in counts.items() if c > 1}
    cp.close()
    qp.close()

