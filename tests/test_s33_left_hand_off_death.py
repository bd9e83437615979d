"""A durable queue whose worker retires and dies while the queue hands off is reopened
elsewhere with its messages: the hand-off runs on the pool's reaction thread under the
follower's lock, so it has ended (failed: ``end_move``) before the loss is reacted to, and no
queue is left moving. (Stop 33 asked whether such a queue is left in limbo; it is not. This
passes on the code of stop 32 too, hence the slow lane.)

The queue's worker has its event loop blocked (``client.run`` of a sleep) so that the
hand-off call waits there; it is killed then. The workers are ``dask worker`` jobs, killed as
a batch system does: nothing restarts them.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from daskqueue import QueuePool
from tests import tasks
from tests.helpers import wait_until
from tests.helpers import job_of as _job_of


async def _block_event_loop(seconds: float) -> None:
    time.sleep(seconds)  # on the worker's event loop: nothing else runs there meanwhile


@pytest.mark.slow  # evidence, 5-13 s; it passes on main too
@pytest.mark.timeout(120)
def test_a_queue_whose_worker_dies_during_its_hand_off_is_reopened_elsewhere(jobs, tmp_path):  # noqa: F811
    client, procs = jobs(2)
    qp = QueuePool(client, 1, durability="durable", dirpath=tmp_path / "pool")
    try:
        victim = qp.queues[0]._address
        [survivor] = set(client.scheduler_info(n_workers=-1)["workers"]) - {victim}
        qp.batch_submit([(tasks.double, x) for x in range(3)])
        job = _job_of(client, procs, victim)
        client.run(_block_event_loop, 30, workers=[victim], wait=False)  # the hand-off waits there
        retiring = threading.Thread(target=lambda: client.retire_workers([victim]), daemon=True)
        retiring.start()
        wait_until(lambda: 0 in qp.table.moving, timeout_s=30)  # the hand-off is under way
        os.killpg(job.pid, signal.SIGKILL)

        wait_until(lambda: qp.queues[0]._address == survivor and 0 not in qp.table.moving, timeout_s=60)
        assert 0 not in qp.table.lost
        assert qp.stats(timeout_s=10)[0].pending == 3
        retiring.join(timeout=30)
    finally:
        qp.close()
