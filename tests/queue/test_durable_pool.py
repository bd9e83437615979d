"""Durable pools on real clusters: reopening, and a worker holding a queue killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from distributed import Client, LocalCluster

from daskqueue import ConfigurationError, ConsumerPool, ForeignDirectoryError, QueuePool
from tests import tasks
from tests.helpers import wait_until


@pytest.fixture
def fresh_cluster():
    clusters = []

    def make(n_workers=2):
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
        clusters.append((cluster, client))
        return client

    yield make
    for cluster, client in clusters:
        client.close()
        cluster.close()


def test_durable_pool_runs_tasks_end_to_end(pools, tmp_path):
    qp = pools.queue(2, durability="durable", dirpath=tmp_path / "pool")
    cp = pools.consumer(qp)
    cp.start()
    assert qp.map(tasks.double, range(20_000)) == [2 * i for i in range(20_000)]
    assert {s.kind for s in qp.stats()} == {"durable"}
    assert sorted(p.name for p in (tmp_path / "pool").iterdir()) == [
        "daskqueue-pool.json", "queue-000", "queue-001"
    ]


def test_new_pool_in_a_new_cluster_recovers_every_queue(fresh_cluster, tmp_path):
    client = fresh_cluster()
    qp = QueuePool(client, 3, durability="durable", dirpath=tmp_path)
    ids = qp.batch_submit([(tasks.double, i) for i in range(3000)])
    qp.close()
    client.cluster.close()  # the whole cluster goes away

    client = fresh_cluster()
    qp = QueuePool(client, 3, durability="durable", dirpath=tmp_path)
    assert sum(s.ready for s in qp.stats()) == 3000
    cp = ConsumerPool(client, qp)
    cp.start()
    cp.join(timeout=60)
    results = cp.results()
    assert [results[i] for i in ids] == [2 * i for i in range(3000)]
    cp.close()
    qp.close()


def test_reopening_with_fewer_queues_or_on_a_foreign_directory_is_refused(client, tmp_path):
    qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "p")
    qp.close()
    with pytest.raises(ConfigurationError, match="n_queues >= 2"):
        QueuePool(client, 1, durability="durable", dirpath=tmp_path / "p")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.csv").write_text("1,2")
    with pytest.raises(ForeignDirectoryError):
        QueuePool(client, 1, durability="durable", dirpath=tmp_path / "other")
    with pytest.raises(ConfigurationError, match="dirpath"):
        QueuePool(client, 1, durability="durable")


def _runs(log):
    """``[(task, start_time), ...]`` from a logged_sleep log."""
    if not os.path.exists(log):
        return []
    return [(int(l.split()[0]), float(l.split()[1])) for l in open(log).read().splitlines()]


def test_killed_durable_queue_worker_loses_no_acknowledged_put_and_redelivers_no_ack(
    fresh_cluster, tmp_path
):
    client = fresh_cluster(2)
    store, log = tmp_path / "pool", str(tmp_path / "runs.log")
    qp = QueuePool(client, 1, durability="durable", dirpath=store, fsync="never")
    cp = ConsumerPool(client, qp, n_consumers=2, batch_size=20)  # consumer 1 on the other worker
    cp.start()

    acknowledged: list[int] = []
    put_errors: list[BaseException] = []
    stop = threading.Event()

    def submit_stream():
        k = 0
        while not stop.is_set():
            batch = [(tasks.logged_sleep, k + j, 0.0005, log) for j in range(200)]
            try:
                # A put in flight at the kill is sent again where the queue moves, with its
                # token: it returns, stored once.
                acknowledged.extend(qp.batch_submit(batch))
            except Exception as e:
                put_errors.append(e)
                return
            k += 200
            time.sleep(0.01)  # the stream's pace, not a wait: puts keep coming around the kill

    submitter = threading.Thread(target=submit_stream)
    submitter.start()
    # Mid-stream: puts acknowledged, and a good many of them run and acked.
    wait_until(lambda: sum(s.total_acked for s in qp.stats()) >= 1000, timeout_s=60, interval_s=0.05)
    acked_before = set(cp.results())  # results ride on acks: these were acked
    victim = qp.queues[0]._address  # where the scheduler put the queue (workers[0] preferred)
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    time.sleep(0.5)  # the stream goes on against the dead worker: part of the scenario
    stop.set()
    submitter.join(timeout=30)
    assert acknowledged and acked_before

    # The pool reopens the queue's directory on the surviving worker by itself (the flock
    # died with the killed process) and moves every handle there: the same pools finish.
    cp.join(timeout=120)
    assert qp.queues[0]._address != victim

    ran = _runs(log)
    ran_ids = {task for task, _ in ran}
    id_of = {task_id: k for k, task_id in enumerate(acknowledged)}
    missing = [k for task_id, k in id_of.items() if k not in ran_ids]
    assert missing == []  # every acknowledged put ran
    rerun_after_crash = {task for task, started in ran if started > killed_at}
    acked_tasks = {id_of[i] for i in acked_before if i in id_of}
    assert rerun_after_crash.isdisjoint(acked_tasks)  # no acked message was delivered again
    assert cp.failures() == {}
    assert put_errors == []
    # No put was stored twice: an outcome came back for exactly the ids the puts returned.
    assert set(cp.results()) == set(acknowledged)
    cp.close()
    qp.close()
