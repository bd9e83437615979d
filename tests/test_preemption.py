"""A preemption in the middle of a durable ``map``: a worker's whole job (its nanny with it,
as ``scancel`` does) is killed, nothing replaces it, and the run must still finish.

The workers are real ``dask worker`` processes, each in its own process group (a nanny and
its worker, like one SLURM job), beside an in-process scheduler: a ``LocalCluster``'s nanny
lives in the test process and would restart the killed worker, hiding the bug this guards
(issue 21: the queue reopened on the survivor numbered its work announcements from 1 again,
the survivor's queue dropped them as older than the dead one's, and its consumer never
looked at the reopened queue).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from daskqueue import ConsumerPool, QueuePool
from tests.helpers import job_of, wait_until


def slow_identity(x):
    """A task of about two milliseconds that returns its argument."""
    time.sleep(0.002)
    return x



@pytest.mark.timeout(240)
# Three jobs is the same path as two (the last queue's job killed, no replacement): slow lane.
@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_a_job_killed_mid_map_with_no_replacement_does_not_hang_the_map(jobs, tmp_path, n):
    client, procs = jobs(n)
    qp = QueuePool(client, n, durability="durable", dirpath=tmp_path / "pool", fsync="never")
    cp = ConsumerPool(client, qp)  # the default: one consumer per worker
    cp.start()
    # About 2 s of work per worker; the kill comes after 200 per worker, with most to go.
    items = list(range(1000 * n))
    out: dict[str, object] = {}

    def run_map():
        try:
            out["results"] = qp.map(slow_identity, items, timeout_s=90)
        except BaseException as e:  # reported by the assertions below
            out["error"] = e

    mapper = threading.Thread(target=run_map, daemon=True)
    mapper.start()
    try:
        wait_until(lambda: "error" in out or sum(s.total_acked for s in qp.stats()) >= 200 * n,
                   timeout_s=90, interval_s=0.02)
        assert "error" not in out, out.get("error")
        # The job of the worker holding the last queue: its nanny and worker, by process group.
        victim = qp.queues[n - 1]._address
        job = job_of(client, procs, victim)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
        mapper.join(timeout=120)
        assert not mapper.is_alive(), "map did not return"
        assert "error" not in out, out.get("error")
        assert out["results"] == items  # every result, once each, in input order
        assert qp.queues[n - 1]._address != victim  # the queue was reopened on a survivor
    finally:
        cp.close()
        qp.close()
