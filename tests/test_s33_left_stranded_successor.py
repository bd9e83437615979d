"""A durable queue whose worker died is being reopened elsewhere, and the worker its new actor
was bound to dies too before the actor started: the queue is reopened on a worker still
there, and keeps its messages.

Before, its successor stayed "starting": Dask holds a task bound to workers that are all gone
until one of them comes back (state ``no-worker``), so the queue waited for its move for
``QUEUE_START_TIMEOUT_S`` (10 min), and was then given up as lost, its directory intact.

The new actor is kept from starting by its worker's one thread being busy; the pool stops
waiting for it after ``SUCCESSOR_WAIT_S`` (shortened here), as it does for a slow start. The
workers are ``dask worker`` jobs (nanny and worker, one process group each), killed as a
batch system does: nothing restarts them.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from daskqueue import QueuePool, defaults
from daskqueue.messages import split_id
from tests import tasks
from tests.helpers import wait_until
from tests.helpers import job_of as _job_of


@pytest.mark.timeout(120)
def test_a_reopening_queue_whose_new_worker_died_too_is_reopened_on_a_worker_still_there(
        jobs, tmp_path, monkeypatch):  # noqa: F811
    client, procs = jobs(3)
    qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "pool")
    try:
        first, survivor = qp.queues[0]._address, qp.queues[1]._address
        [spare] = set(client.scheduler_info(n_workers=-1)["workers"]) - {first, survivor}
        task_id = next(i for i in (qp.submit(tasks.double, 21) for _ in range(4)) if split_id(i)[0] == 0)
        busy = client.submit(time.sleep, 60, workers=[spare], pure=False)  # its one thread
        wait_until(lambda: client.processing([spare])[spare], timeout_s=10)
        monkeypatch.setattr(defaults, "SUCCESSOR_WAIT_S", 0.5)

        os.killpg(_job_of(client, procs, first).pid, signal.SIGKILL)
        # Queue 0 reopens on the spare worker (the one with no queue), which cannot start it now.
        wait_until(lambda: 0 in qp.follower._starting, timeout_s=30)
        monkeypatch.setattr(defaults, "SUCCESSOR_WAIT_S", 20.0)
        os.killpg(_job_of(client, procs, spare).pid, signal.SIGKILL)
        busy.release()

        wait_until(lambda: qp.queues[0]._address == survivor and 0 not in qp.table.moving, timeout_s=30)
        assert 0 not in qp.table.lost
        assert qp.stats(timeout_s=10)[0].pending == 1  # its message is still there
        assert split_id(task_id)[0] == 0
    finally:
        qp.close()
