"""A transient queue whose retiring worker dies right after handing its state over is not
lost: the client holds the whole state and the successor takes it. Before, the failed
``handoff_done`` to the dead actor made the pool drop the successor and keep the old actor,
and the worker's death then gave the queue up as lost with every message in it."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import daskqueue.queue.follow as follow
from daskqueue import ConsumerPool, QueuePool
from daskqueue.scheduler_query import scheduler_workers
from tests import tasks


@pytest.mark.timeout(120)
def test_a_queue_handed_off_by_a_worker_that_then_dies_moves_with_every_message(cluster_factory, monkeypatch):
    cluster, client = cluster_factory(3)
    qp = QueuePool(client, 1)
    ids = qp.batch_submit([(tasks.double, i) for i in range(50)])  # no consumer yet: all wait in the queue
    victim = qp.queues[0]._address
    pid = client.run(os.getpid, workers=[victim])[victim]
    real_confirm = follow.confirm_hand_off
    killed = []

    def confirm_after_the_worker_died(old, method):
        # The state is in the client, the successor started: now the old worker dies (SIGKILL),
        # before it hears that the hand-off is final.
        if method == "handoff_done" and not killed:
            os.kill(pid, signal.SIGKILL)
            killed.append(old._address)
            deadline = time.monotonic() + 30
            while old._address in scheduler_workers(client) and time.monotonic() < deadline:
                time.sleep(0.05)
        return real_confirm(old, method)

    monkeypatch.setattr(follow, "confirm_hand_off", confirm_after_the_worker_died)
    retiring = threading.Thread(target=lambda: client.retire_workers([victim]), daemon=True)
    retiring.start()
    deadline = time.monotonic() + 60
    while (not killed or qp.queues[0]._address == victim) and time.monotonic() < deadline:
        time.sleep(0.05)

    assert killed == [victim]
    assert qp.queues[0]._address != victim
    cp = ConsumerPool(client, qp, n_consumers=1, isolation="thread")
    cp.start()
    cp.join(timeout=30)
    assert cp.results() == {i: 2 * k for k, i in enumerate(ids)}
    cp.close()
    qp.close()
