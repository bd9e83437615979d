"""A poll that waits for a moving queue holds no lock other threads need.

A durable queue lost with its worker is reopened on the surviving one; while that worker's
only thread is busy (a long Dask task), the successor cannot start, and a poll that asks the
queue waits for the move (up to ``MOVE_WAIT_S``). Before, that wait happened inside the
result collector's lock (the send is ``table.call``, which waits for a moving queue), so
whatever another thread did with the serving queue's outcomes waited as long (11.5 s here),
for nothing of the moving queue: a poll of it (``result`` of a task there), a submit to it
(which starts its outcome's poll). A poll of *every* queue (``results()``, a map's wait, a
join) still waits for the moving queue itself: it must ask it, and its call is what wakes a
resting queue.

The workers are ``dask worker`` jobs of their own (nanny and worker, one process group), so
that killing one's group leaves nothing to restart it, as a batch system's kill does.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from daskqueue import QueuePool
from tests import tasks
from tests.helpers import job_of, wait_until

#: How long the surviving worker's only thread stays busy (the successor starts after it).
BUSY_S = 8.0
#: Far below BUSY_S, far above a poll of a serving queue.
BOUND_S = 3.0



@pytest.mark.timeout(150)
def test_a_poll_of_a_serving_queue_does_not_wait_behind_a_poll_waiting_for_a_moving_queue(jobs, tmp_path):
    client, procs = jobs(2)
    qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "pool")
    try:
        a, b = (h._address for h in qp.table.handles)
        assert a != b, "the queues are meant to be on different workers"
        assert qp.poll_outcomes() == 0  # both serve (and the lanes, if any, are made)

        # The survivor's only thread is busy: a successor of queue 0 cannot start there yet.
        busy = client.submit(time.sleep, BUSY_S, workers=[b], pure=False)
        wait_until(lambda: client.processing(workers=[b])[b], timeout_s=30)
        os.killpg(job_of(client, procs, a).pid, signal.SIGKILL)
        wait_until(lambda: 0 in qp.table.moving, timeout_s=30)

        # Another thread polls every queue: it waits for queue 0's move.
        waiting = threading.Thread(target=qp.poll_outcomes, daemon=True)
        waiting.start()
        time.sleep(0.5)
        assert waiting.is_alive() and 0 in qp.table.moving

        started = time.monotonic()
        assert qp.poll_outcomes(queue_index=1) == 0
        took = time.monotonic() - started
        assert took < BOUND_S, f"a poll of serving queue 1 waited {took:.1f} s behind queue 0's move"

        # A small send to queue 1 starts its outcome's poll there (prime): not behind it either.
        key = next(f"k{i}" for i in range(1000) if qp.router.route(None, f"k{i}") == 1)
        started = time.monotonic()
        qp.submit(tasks.double, 1, dq_key=key)
        took = time.monotonic() - started
        assert took < BOUND_S, f"a submit to serving queue 1 waited {took:.1f} s behind queue 0's move"
        assert waiting.is_alive() and 0 in qp.table.moving  # all of it while queue 0 still moved

        busy.result(timeout=60)
        waiting.join(timeout=60)
        assert not waiting.is_alive()
        assert 0 not in qp.table.moving and qp.table.handles[0]._address == b
    finally:
        qp.close()
