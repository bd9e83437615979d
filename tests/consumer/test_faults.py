"""Faults with real processes: a consumer's worker is killed with SIGKILL mid-batch."""

from __future__ import annotations

import os
import signal
import time

import pytest
from distributed import Client, LocalCluster

from daskqueue import ConsumerPool, QueuePool
from tests import tasks
from tests.helpers import wait_until


@pytest.fixture
def three_workers():
    with LocalCluster(
        n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        yield client


@pytest.mark.parametrize("durability", ["transient", "durable"])
def test_killed_consumer_leases_are_redelivered_and_it_is_replaced(three_workers, durability, tmp_path):
    client = three_workers
    where = {"dirpath": tmp_path / "q"} if durability == "durable" else {}
    # A lease far longer than the test: only the loss detection can bring the work back.
    qp = QueuePool(client, 1, lease_timeout_s=120, durability=durability, **where)
    cp = ConsumerPool(client, qp, n_consumers=3, batch_size=5)
    cp.start()
    # The victim: a consumer's worker that does not hold the queue. Placement is what the
    # scheduler made of the pools' preferences, so look rather than assume.
    queue_address = qp.queues[0]._address
    k = max(i for i, c in enumerate(cp.consumers) if c._address != queue_address)
    victim = cp.consumers[k]._address
    on_victim = sum(c._address == victim for c in cp.consumers)
    ids = qp.batch_submit([(tasks.logged_sleep, i, 0.01, os.devnull) for i in range(600)])
    # Kill it while it holds leased work (not between two batches).
    wait_until(lambda: cp.stats()[k].inflight_items > 0, timeout_s=30, interval_s=0.05)
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)

    cp.join(timeout=60)

    results = cp.results()
    assert sorted(results[i] for i in ids) == list(range(600))
    assert cp.failures() == {}
    # The killed consumer held leases: taken back when its worker was reported lost, not
    # after the lease expired.
    assert sum(s.total_worker_lost for s in qp.stats()) > 0
    assert sum(s.total_expired for s in qp.stats()) == 0
    wait_until(lambda: cp.replaced == on_victim, timeout_s=30)
    assert all(s.running for s in cp.stats())
    qp.close()
    cp.close()


def test_a_lost_transient_queue_is_a_clear_error_naming_it(three_workers):
    from daskqueue import QueueLostError

    client = three_workers
    qp = QueuePool(client, 2)
    cp = ConsumerPool(client, qp, n_consumers=1)
    cp.start()
    assert qp.map(tasks.double, range(10)) == [2 * i for i in range(10)]
    consumer_home = cp.consumers[0]._address
    lost = next(i for i, q in enumerate(qp.queues) if q._address != consumer_home)
    victim = qp.queues[lost]._address
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    # A call racing the death can spend Dask's connect timeout (30 s) on the dead address;
    # once the scheduler has noticed, Dask refuses calls to the actor at once.
    wait_until(lambda: qp._queue_futures[lost].status != "finished", timeout_s=30, interval_s=0.05)
    with pytest.raises(QueueLostError, match=f"queue {lost} was lost") as info:
        qp.stats()
    assert info.value.queue_index == lost and "transient" in str(info.value)
    with pytest.raises(QueueLostError):
        qp.map(tasks.double, range(10), timeout_s=30)
    # A consumer whose call to the dead queue was in flight gives it up once the pool tells
    # it the worker left: closing is bounded (it once hung here for good).
    started = time.monotonic()
    cp.close()
    qp.close()
    assert time.monotonic() - started < 30
