"""When a worker leaves: its lifetime's timer read on a real worker, and SLURM's answer
(``squeue`` replaced by a stand-in: the real one runs in ``tests/slurm/test_walltime.py``)."""

from __future__ import annotations

import subprocess
import time
from types import SimpleNamespace

import pytest

from daskqueue import defaults
from daskqueue.consumer.leaving import lifetime_end, lifetime_timer, slurm_end, slurm_retire_before_s


def squeue_says(stdout, returncode=0):
    calls = []

    def run(args, **kwargs):
        calls.append(args)
        return SimpleNamespace(stdout=stdout, stderr="", returncode=returncode)

    return run, calls


@pytest.mark.timeout(30)
def test_a_jobs_end_is_now_plus_squeues_time_left():
    run, calls = squeue_says("9:58\n")
    assert slurm_end(environ={"SLURM_JOB_ID": "42"}, now=1000.0, run=run) == 1598.0
    assert calls == [["squeue", "-h", "-j", "42", "-o", "%L"]]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("environ, stdout, returncode", [
    ({}, "9:58", 0),  # not in a SLURM job
    ({"SLURM_JOB_ID": "42"}, "UNLIMITED", 0),
    ({"SLURM_JOB_ID": "42"}, "", 1),  # squeue failed
])
def test_no_end_is_known_outside_a_job_without_a_limit_or_when_squeue_fails(environ, stdout, returncode):
    run, _ = squeue_says(stdout, returncode)
    assert slurm_end(environ=environ, now=0.0, run=run) is None


@pytest.mark.timeout(30)
def test_a_missing_squeue_means_no_end():
    def run(args, **kwargs):
        raise FileNotFoundError("squeue")

    assert slurm_end(environ={"SLURM_JOB_ID": "1"}, run=run) is None

    def slow(args, **kwargs):
        raise subprocess.TimeoutExpired(args, 10)

    assert slurm_end(environ={"SLURM_JOB_ID": "1"}, run=slow) is None


@pytest.mark.timeout(30)
def test_the_jobs_environment_may_set_how_long_before_its_end_a_worker_retires():
    assert slurm_retire_before_s({}) == defaults.SLURM_RETIRE_BEFORE_S
    assert slurm_retire_before_s({"DASKQUEUE_SLURM_RETIRE_BEFORE_S": "120"}) == 120.0
    assert slurm_retire_before_s({"DASKQUEUE_SLURM_RETIRE_BEFORE_S": "soon"}) == defaults.SLURM_RETIRE_BEFORE_S


async def _ends(dask_worker):
    return lifetime_timer(dask_worker), lifetime_end(dask_worker)


@pytest.mark.timeout(120)
def test_a_workers_lifetime_end_is_read_off_the_timer_dask_set(cluster_factory):
    cluster, client = cluster_factory(1, lifetime="300s", lifetime_stagger="0s")
    (timer, end), = client.run(_ends).values()
    now = time.time()
    assert timer is not None and end == pytest.approx(timer, abs=1.0)
    assert now + 200 < end <= now + 300  # 300 s from the worker's start, which was just now


@pytest.mark.timeout(120)
def test_a_worker_without_a_lifetime_has_no_end(client):
    assert set(client.run(_ends).values()) == {(None, None)}
