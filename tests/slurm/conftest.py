"""The ``slurm`` lane: daskqueue on ``dask_jobqueue.SLURMCluster`` against a real single-node
SLURM that ``setup_slurm.sh`` starts (Debian's slurm-wlm and munge).

Run it with ``bash tests/slurm/setup_slurm.sh && python -m pytest -m slurm tests/slurm`` (the
fixture runs the set-up itself when nothing runs yet, and then stops what it started). Every
test here skips, with the set-up script's one-line reason, where SLURM cannot start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
#: The checkout the tests import daskqueue from: the jobs' workers must import the same one.
ROOT = HERE.parent.parent
SETUP = HERE / "setup_slurm.sh"
STOP = HERE / "stop_slurm.sh"


@pytest.fixture(scope="session")
def slurm():
    """A running single-node SLURM: ``SLURM_CONF`` set in this process (``sbatch`` and
    ``scancel`` of the jobqueue cluster inherit it). Skips with the set-up script's reason."""
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (pip install -e '.[test]')")
    try:
        done = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("setup_slurm.sh did not finish within 600 s")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0:
        reason = next((line for line in reversed(lines) if "cannot start SLURM" in line),
                      (lines or [done.stderr.strip() or f"setup_slurm.sh exited {done.returncode}"])[-1])
        pytest.skip(reason)
    conf = next(line.split("=", 1)[1] for line in reversed(lines) if line.startswith("SLURM_CONF="))
    started_here = not any("already running" in line for line in lines)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    if started_here:
        subprocess.run(["bash", str(STOP)], capture_output=True, timeout=120)


def squeue_ids() -> set[str]:
    """The ids of the jobs SLURM holds (pending or running)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30, check=True)
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


@pytest.fixture
def slurm_cluster(slurm, tmp_path):
    """Make ``SLURMCluster``s (``make(**extra options)`` -> cluster, client) whose jobs run this
    interpreter on this checkout; all closed after the test, and their jobs gone from SLURM."""
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    made = []

    def make(**kwargs):
        options = dict(
            cores=1, processes=1, memory="2GB", python=sys.executable, walltime="00:10:00",
            log_directory=str(tmp_path / "jobs"), local_directory=str(tmp_path / "workers"),
            # The jobs inherit the environment anyway (sbatch --export=ALL); said explicitly so
            # that a site default of --export=NONE still runs this checkout.
            job_script_prologue=[f"export PYTHONPATH={ROOT}{os.pathsep}${{PYTHONPATH:-}}"],
            scheduler_options={"dashboard_address": ":0"},
        )
        options.update(kwargs)
        cluster = SLURMCluster(**options)
        client = Client(cluster)
        made.append((cluster, client))
        return cluster, client

    yield make
    for cluster, client in reversed(made):
        ids = {str(job.job_id) for job in cluster.workers.values() if getattr(job, "job_id", None)}
        try:
            client.close(timeout=30)
        finally:
            cluster.close(timeout=60)
        deadline = time.monotonic() + 30
        while ids & squeue_ids() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = ids & squeue_ids()
        if left:  # never leave a job holding the node's 2 CPUs for the next test
            subprocess.run(["scancel", *sorted(left)], timeout=30)
