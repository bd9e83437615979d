"""A pool passed to a plain Dask task (``client.submit(f, queue_pool)``) follows a queue that
moves while the task submits: the queue's worker retires and hands the queue off, and the
task's next puts go to the successor. Before, the task's handle (no client there, so no
registry to read) kept calling the freed actor, whose calls Dask's worker-side ``Actor``
never answers, and every put after the move ended in ``QueueLostError`` after ~55 s although
the queue was alive on another worker."""

from __future__ import annotations

import time

import pytest

from daskqueue import ConsumerPool, QueuePool
from tests import tasks


def _produce(qp, n, started_path):
    """Submit ``n`` tasks, 20 ms apart; the ids, and the longest single submit."""
    ids, worst = [], 0.0
    for i in range(n):
        if i == 5:
            open(started_path, "w").close()  # the test retires the queue's worker now
        t = time.monotonic()
        ids.append(qp.submit(tasks.double, i))
        worst = max(worst, time.monotonic() - t)
        time.sleep(0.02)
    return ids, worst


@pytest.mark.timeout(120)
# The durable run (the same registry reads; its successor opens the directory) is slow-lane.
@pytest.mark.parametrize("durability", ["transient", pytest.param("durable", marks=pytest.mark.slow)])
def test_a_task_submitting_through_a_pickled_pool_follows_its_queue_off_a_retiring_worker(cluster_factory, tmp_path,
                                                                                        durability):
    cluster, client = cluster_factory(3)
    qp = QueuePool(client, 1, durability=durability, dirpath=tmp_path / "pool" if durability == "durable" else None)
    cp = ConsumerPool(client, qp, n_consumers=1, isolation="thread")
    cp.start()
    victim = qp.queues[0]._address
    producer_worker = next(w for w in client.scheduler_info()["workers"] if w != victim)
    started = tmp_path / "started"
    fut = client.submit(_produce, qp, 60, str(started), workers=[producer_worker], pure=False)
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started.exists()

    assert list(client.retire_workers([victim])) == [victim]
    ids, worst = fut.result(timeout=60)

    assert qp.queues[0]._address != victim
    assert len(ids) == 60 and len(set(ids)) == 60
    assert worst < 20  # followed the move, not a wait for loss detection
    cp.join(timeout=30)
    results = cp.results()
    assert all(results[i] == 2 * k for k, i in enumerate(ids))  # nothing lost, each once
    cp.close()
    qp.close()
