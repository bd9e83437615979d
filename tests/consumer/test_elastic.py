"""Pools that follow a changing cluster: workers that join, workers killed with SIGKILL,
tasks that kill their process. Real LocalClusters, real signals, real `cluster.scale`."""

from __future__ import annotations

import functools
import os
import time
from collections import Counter

import pytest

from daskqueue import ConsumerPool, QueuePool
from daskqueue.errors import NoConsumersError, QueueLostError
from daskqueue.messages import split_id
from tests import tasks
from tests.helpers import kill_worker, wait_until

#: The bound the pools promise for any public call after a worker dies.
BOUND_S = 30.0


def live_consumers(cp):
    return [c for c in cp.consumers if c._address in cp._membership.workers]


def test_workers_that_join_after_the_pools_exist_get_consumers_and_run_tasks(cluster_factory):
    cluster, client = cluster_factory(1)
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp)
    cp.start()
    cluster.scale(3)
    client.wait_for_workers(3, timeout=60)
    # No call from the user: the pool follows the cluster on its own.
    wait_until(lambda: len({c._address for c in cp.consumers}) == 3)
    ids = qp.batch_submit([(tasks.pid_after, i, 0.01) for i in range(300)])
    cp.join(timeout=60)
    results = cp.results()
    assert sorted(results[i][0] for i in ids) == list(range(300))
    per_process = Counter(pid for _, pid in (results[i] for i in ids))
    assert len(per_process) == 3, per_process  # every worker's consumer ran some
    cp.close()
    qp.close()


@pytest.mark.parametrize("n_consumers", [None, 3])
def test_a_killed_consumers_leases_come_back_at_once_and_it_is_replaced(cluster_factory, n_consumers):
    cluster, client = cluster_factory(3)
    # A lease long enough that only the loss detection can explain a quick finish.
    qp = QueuePool(client, 1, lease_timeout_s=120)
    cp = ConsumerPool(client, qp, n_consumers=n_consumers, batch_size=5)
    cp.start()
    queue_address = qp.queues[0]._address
    victim_k = next(i for i, c in enumerate(cp.consumers) if c._address != queue_address)
    victim = cp.consumers[victim_k]._address
    ids = qp.batch_submit([(tasks.pid_after, i, 0.02) for i in range(600)])
    wait_until(lambda: cp.stats()[victim_k].inflight_items > 0)
    killed_at = time.monotonic()
    kill_worker(client, victim)

    cp.join(timeout=60)

    assert time.monotonic() - killed_at < 60  # far below the 120 s lease
    results = cp.results()
    assert sorted(results[i][0] for i in ids) == list(range(600))
    stats = qp.stats()[0]
    assert stats.total_expired == 0
    assert stats.total_worker_lost > 0  # its leases were taken back on the loss, not by expiry
    # Replaced with no call from the user; nanny restarts the worker under a new address.
    wait_until(lambda: len(live_consumers(cp)) == 3)
    assert all(s.running for s in cp.stats())
    if n_consumers is not None:
        assert cp.replaced >= 1
    cp.close()
    qp.close()


def test_a_task_that_kills_its_process_costs_only_itself(cluster_factory):
    cluster, client = cluster_factory(2)
    qp = QueuePool(client, 1, max_retries=2)
    cp = ConsumerPool(client, qp, batch_size=10)
    cp.start()
    queue_pid = client.run(os.getpid, workers=[qp.queues[0]._address])[qp.queues[0]._address]

    out = qp.map(functools.partial(tasks.exit_if, bad=50), range(101), errors="return", timeout_s=120)

    assert [v for i, v in enumerate(out) if i != 50] == [2 * i for i in range(101) if i != 50]
    error = out[50]
    assert error.exc_type == "daskqueue.errors.KilledWorkerError"
    assert error.attempts == 3  # max_retries=2: three runs, each killed its process
    # The queue and its worker lived through it.
    address = qp.queues[0]._address
    assert client.run(os.getpid, workers=[address])[address] == queue_pid
    assert qp.stats()[0].pending == 0
    cp.close()
    qp.close()


def test_public_calls_are_bounded_after_a_transient_queues_worker_dies(cluster_factory):
    cluster, client = cluster_factory(3)
    qp = QueuePool(client, 2)
    cp = ConsumerPool(client, qp, n_consumers=1)
    cp.start()
    assert qp.map(tasks.double, range(10)) == [2 * i for i in range(10)]
    home = cp.consumers[0]._address
    lost = next(i for i, q in enumerate(qp.queues) if q._address != home)
    ids = qp.batch_submit([(tasks.sleep_then, i, 0.05) for i in range(200)])
    lost_ids = [i for i in ids if split_id(i)[0] == lost]
    kill_worker(client, qp.queues[lost]._address)

    def bounded(call):
        started = time.monotonic()
        try:
            return call()
        finally:
            assert time.monotonic() - started < BOUND_S

    with pytest.raises(QueueLostError, match=f"queue {lost} was lost") as info:
        bounded(lambda: cp.join(timeout=120))
    assert "transient" in str(info.value)
    with pytest.raises(QueueLostError):
        bounded(qp.stats)
    assert info.value.queue_index == lost
    assert 0 < info.value.lost_messages <= len(lost_ids)
    assert f"{info.value.lost_messages:,} of its transient messages" in str(info.value)
    with pytest.raises(QueueLostError):
        bounded(lambda: qp.map(tasks.double, range(10), timeout_s=120))
    with pytest.raises(QueueLostError):
        bounded(lambda: cp.result(lost_ids[-1], timeout=120))
    bounded(cp.cancel)
    bounded(cp.close)
    bounded(qp.close)


def test_map_and_join_without_a_started_consumer_raise_at_once(client):
    qp = QueuePool(client, 1)
    try:
        with pytest.raises(NoConsumersError, match="start"):
            qp.map(tasks.double, range(3), timeout_s=5)
        cp = ConsumerPool(client, qp)
        qp.batch_submit([(tasks.double, 1)])
        with pytest.raises(NoConsumersError, match="start"):
            cp.join(timeout=5)
        cp.start()
        cp.join(timeout=30)
        assert qp.map(tasks.double, range(3), timeout_s=30) == [0, 2, 4]
        cp.close()
    finally:
        qp.close()


def test_queues_are_spread_over_distinct_workers(cluster_factory):
    cluster, client = cluster_factory(3)
    for _ in range(3):
        qp = QueuePool(client, 3)
        assert len({q._address for q in qp.queues}) == 3
        qp.close()


def test_a_durable_queues_killed_worker_is_reopened_elsewhere_and_every_task_finishes(
    cluster_factory, tmp_path
):
    cluster, client = cluster_factory(3)
    qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "pool")
    cp = ConsumerPool(client, qp)
    cp.start()
    ids = qp.batch_submit([(tasks.sleep_then, i, 0.005) for i in range(2000)])
    victim = qp.queues[1]._address
    wait_until(lambda: qp.stats()[1].total_acked > 50)
    kill_worker(client, victim)

    cp.join(timeout=120)  # no QueueLostError: the queue moved and the join carried on

    assert qp.queues[1]._address != victim
    results = cp.results()
    assert sorted(results[i] for i in ids) == list(range(2000))
    assert cp.failures() == {}
    assert qp.map(tasks.double, range(100), timeout_s=60) == [2 * i for i in range(100)]
    cp.close()
    qp.close()


def test_churn_every_task_of_a_durable_pool_has_one_result_while_workers_die_and_join(
    cluster_factory, tmp_path
):
    """25,000 short tasks while, every 1.5 s, a queue's worker is killed (SIGKILL; its nanny
    starts a new worker: a join), a worker is added, a worker is killed or one retired."""
    import random
    import threading

    cluster, client = cluster_factory(3)
    qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "pool", fsync="never")
    cp = ConsumerPool(client, qp)
    cp.start()
    stop = threading.Event()
    done: list[str] = []

    def churn():
        rng = random.Random(7)
        step = 0
        while not stop.wait(1.5):
            workers = sorted(client.scheduler_info()["workers"])
            holding = [q._address for q in qp.queues if q._address in workers]
            try:
                if step % 4 in (0, 2) and holding:
                    victim = holding[step // 2 % len(holding)]
                    kill_worker(client, victim)
                    done.append(f"killed queue worker {victim}")
                elif step % 4 == 1:
                    cluster.scale(len(cluster.workers) + 1)
                    done.append("added a worker")
                elif len(workers) > 2:
                    victim = rng.choice(workers)
                    client.retire_workers([victim])
                    done.append(f"retired {victim}")
            except Exception as e:  # a worker that left meanwhile: the churn goes on
                done.append(f"{type(e).__name__}: {e}")
            step += 1

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        out = qp.map(tasks.sleep_then_arg, range(25_000), timeout_s=240)
    finally:
        stop.set()
        churner.join(timeout=60)
    assert out == list(range(25_000))
    # Exactly one outcome came back per task: none was acked twice.
    assert sum(qp.collector.settled) == 25_000
    assert sum("killed" in d for d in done) >= 2, done
    cp.close()
    qp.close()
