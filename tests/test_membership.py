"""Workers retired gracefully and clusters that adapt to the queues' backlog: real
``LocalCluster``s, real ``retire_workers``, ``cluster.adapt()``, and dask-jobqueue's own local
cluster with a worker ``--lifetime``."""

from __future__ import annotations

import os
import time

import pytest
from distributed import Client

from daskqueue import ConsumerPool, QueuePool
from daskqueue.membership import queue_target
from tests import backlog_tasks, tasks
from tests.helpers import wait_until

#: What the issue promises: a retired queue worker leaves within this.
LEAVE_S = 30.0


def load(ready, leased=0, task_s=None):
    return {"ready": ready, "leased": leased, "delayed": 0, "task_s": task_s}


def test_queue_target_sizes_the_backlog_like_dask_does():
    size = dict(target_duration_s=5.0, unknown_task_s=0.5, threads_per_worker=1.0)
    assert queue_target([], **size) == 0
    assert queue_target([load(0)], **size) == 0
    assert queue_target([load(3000, task_s=0.01)], **size) == 6  # 30 s of work in 5 s
    assert queue_target([load(1500, 500, 0.01), load(1000, task_s=0.01)], **size) == 6
    assert queue_target([load(2, task_s=100.0)], **size) == 2  # never more threads than messages
    assert queue_target([load(20)], **size) == 2  # unmeasured: Dask's unknown-task duration
    assert queue_target([load(3000, task_s=0.01)], **dict(size, threads_per_worker=4.0)) == 2


def _runs(log):
    return [int(line.split()[0]) for line in open(log).read().splitlines()] if os.path.exists(log) else []


@pytest.mark.parametrize("durability", ["transient", "durable"])
def test_retiring_a_queues_worker_moves_the_queue_and_loses_nothing(cluster_factory, tmp_path, durability):
    cluster, client = cluster_factory(3)
    kwargs = {"dirpath": tmp_path / "pool"} if durability == "durable" else {}
    qp = QueuePool(client, 2, durability=durability, **kwargs)
    cp = ConsumerPool(client, qp)
    cp.start()
    log = str(tmp_path / "runs.log")
    ids = qp.batch_submit([(tasks.logged_sleep, i, 0.002, log) for i in range(3000)])
    victim = qp.queues[0]._address
    wait_until(lambda: qp.stats()[0].total_acked > 100 and qp.stats()[0].leased > 0)

    started = time.monotonic()
    retired = client.retire_workers([victim])
    left_s = time.monotonic() - started

    assert list(retired) == [victim] and left_s < LEAVE_S
    assert victim not in client.scheduler_info()["workers"]
    assert qp.queues[0]._address != victim
    more = qp.batch_submit([(tasks.logged_sleep, i, 0.0, log) for i in range(3000, 3100)])
    cp.join(timeout=120)
    results = cp.results()
    assert [results[i] for i in ids + more] == list(range(3100))
    assert cp.failures() == {}
    runs = _runs(log)
    assert sorted(runs) == list(range(3100))  # every task ran once: no lease came back
    assert all(s.total_retried == 0 and s.total_worker_lost == 0 for s in qp.stats())
    cp.close()
    qp.close()


def test_a_backlog_scales_the_cluster_up_and_scale_down_hands_queues_off(cluster_factory, tmp_path):
    cluster, client = cluster_factory(1)
    # Adapt looks every 0.5 s, not 1 s: it scales down after 3 looks that find the pool idle,
    # and the test waits for that (the hand-off is the point, not adapt's patience).
    cluster.adapt(minimum=1, maximum=3, interval="0.5s")
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp)
    cp.start()

    started = time.monotonic()
    # 20 s of work for one worker: 3 workers' worth at Dask's target duration (5 s) for the
    # first 10 s, time enough for the new workers to come. Once they came, the rest of the
    # backlog runs without its sleeps (its length was for the scale-up, not for the join).
    gate = str(tmp_path / "scaled-up")
    ids = qp.batch_submit([(backlog_tasks.sleep_until_opened, i, 0.01, gate) for i in range(2000)])
    wait_until(lambda: len(client.scheduler_info()["workers"]) == 3, timeout_s=30)
    scaled_up_s = time.monotonic() - started
    open(gate, "w").close()
    cp.join(timeout=120)
    results = cp.results()
    assert [results[i] for i in ids] == list(range(2000))

    # Idle again: adapt retires workers (through the queue's hand-off if it is on one).
    wait_until(lambda: len(client.scheduler_info()["workers"]) == 1, timeout_s=60)
    assert qp.map(tasks.double, range(50), timeout_s=60) == [2 * i for i in range(50)]
    assert cp.failures() == {}
    assert scaled_up_s < 15, scaled_up_s
    cp.close()
    qp.close()


@pytest.mark.slow  # 30-60 s; the same shape runs on real SLURM jobs in the slurm lane
# (tests/slurm/test_slurm.py, --lifetime hand-off under adapt) and a lifetime hand-off of a
# transient queue in the default suite (tests/consumer/test_walltime_cluster.py)
def test_dask_jobqueue_workers_reaching_their_lifetime_hand_their_queues_off():
    jobqueue = pytest.importorskip("dask_jobqueue.local")
    # Both jobs start together and reach their lifetime within 2 s of each other: for a
    # moment no worker can take the queues, whose state then waits in the client.
    cluster = jobqueue.LocalCluster(
        cores=1, processes=1, memory="2GiB",
        worker_extra_args=["--lifetime", "8s", "--lifetime-stagger", "2s"],
        scheduler_options={"dashboard_address": None},
    )
    client = Client(cluster)
    try:
        cluster.adapt(minimum=2, maximum=2)
        client.wait_for_workers(2, timeout=60)
        qp = QueuePool(client, 2)  # transient: only a graceful hand-off keeps its messages
        cp = ConsumerPool(client, qp)
        cp.start()
        first = {q._address for q in qp.queues}
        # About 6 s of work for 2 workers: past the first jobs' lifetime, once their start
        # (a second or two) and their last seconds (when a walltime-aware consumer takes
        # nothing it cannot finish) are counted.
        ids = qp.batch_submit([(tasks.sleep_then, i, 0.02) for i in range(600)])
        cp.join(timeout=180)
        results = cp.results()
        assert [results[i] for i in ids] == list(range(600))
        assert cp.failures() == {}
        # The jobs that held the queues ended their lifetime meanwhile; the queues moved.
        assert first != {q._address for q in qp.queues}
        assert all(s.total_worker_lost == 0 for s in qp.stats())
        cp.close()
        qp.close()
    finally:
        client.close()
        cluster.close()


def test_a_backlog_scales_a_dask_jobqueue_cluster_up_through_its_own_adapt(tmp_path):
    jobqueue = pytest.importorskip("dask_jobqueue.local")
    cluster = jobqueue.LocalCluster(cores=1, processes=1, memory="2GiB",
                                    scheduler_options={"dashboard_address": None})
    client = Client(cluster)
    try:
        cluster.adapt(minimum=1, maximum=2)
        client.wait_for_workers(1, timeout=60)
        qp = QueuePool(client, 1)
        cp = ConsumerPool(client, qp)
        cp.start()
        # 20 s of work for one worker: only the queue's reported backlog can ask for a job, and
        # it asks for 2 workers (Dask's target duration: 5 s) for 15 s, time enough for a job
        # to start under load. Once it started, the rest of the backlog runs without its
        # sleeps (its length was for the scale-up, not for the join).
        gate = str(tmp_path / "scaled-up")
        ids = qp.batch_submit([(backlog_tasks.sleep_until_opened, i, 0.01, gate) for i in range(2000)])
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 2, timeout_s=45)
        open(gate, "w").close()
        cp.join(timeout=120)
        results = cp.results()
        assert [results[i] for i in ids] == list(range(2000))
        cp.close()
        qp.close()
    finally:
        client.close()
        cluster.close()
