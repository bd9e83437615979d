"""Faults with real processes: a consumer's worker is killed with SIGKILL mid-batch."""

from __future__ import annotations

import os

import pytest
from distributed import Client, LocalCluster

from daskqueue import ConsumerPool, QueuePool
from tests import tasks
from tests.helpers import kill_worker, wait_until


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
    kill_worker(client, victim)

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
