"""Walltime on a real SLURM, without ``--lifetime``: each job's worker reads its job's end from
``squeue``, retires itself before it (handing its transient queue off) and takes no task it
cannot finish by then; adapt replaces the jobs. No task runs twice and nothing is lost."""

from __future__ import annotations

import os

import pytest

from daskqueue import ConsumerPool, QueuePool
from tests import walltime_tasks
from tests.slurm.conftest import ROOT

pytestmark = pytest.mark.slurm

JOB_START_S = 90
TASK_S = 3.0
#: The jobs' walltime is SLURM's smallest, one minute; they retire this long before its end.
RETIRE_BEFORE_S = 35


@pytest.mark.timeout(280)
def test_jobs_reaching_their_walltime_retire_first_and_run_no_task_twice(slurm_cluster, tmp_path):
    cluster, client = slurm_cluster(
        walltime="00:01:00",
        job_script_prologue=[f"export PYTHONPATH={ROOT}{os.pathsep}${{PYTHONPATH:-}}",
                             f"export DASKQUEUE_SLURM_RETIRE_BEFORE_S={RETIRE_BEFORE_S}"],
    )
    cluster.adapt(minimum_jobs=2, maximum_jobs=2)
    client.wait_for_workers(2, timeout=JOB_START_S)
    first = set(client.scheduler_info()["workers"])
    qp = QueuePool(client, 2)  # transient: a job killed at its walltime would lose its queue
    cp = ConsumerPool(client, qp)
    cp.start()
    log = tmp_path / "runs.log"
    n = 24  # ~36 s of 3 s tasks on two consumers: across the first jobs' retirement

    out = qp.map(walltime_tasks.logged_run, [(i, TASK_S, str(log)) for i in range(n)], timeout_s=220)

    assert out == list(range(n))
    assert cp.failures() == {}
    # The first jobs' workers left before their walltime, retiring themselves (not killed:
    # the map outlives them, and SLURM would kill them only at 60 s).
    assert not first & set(client.scheduler_info()["workers"]), "the first jobs' workers did not leave"
    retired = sum(f.read_text().count("Reason: daskqueue-slurm-walltime") for f in (tmp_path / "jobs").glob("*.err"))
    assert retired >= 2
    starts = walltime_tasks.starts(log)
    assert sorted(starts) == list(range(n))
    assert all(c == 1 for c in starts.values()), {x: c for x, c in starts.items() if c > 1}
    assert all(s.total_worker_lost == 0 and s.total_expired == 0 for s in qp.stats())
    cp.close()
    qp.close()
