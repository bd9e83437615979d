"""Pools on adaptive clusters that start from, and rest at, zero workers (issue 21, points 2
and 3), on real LocalClusters whose ``adapt`` runs every 0.2 s; and the actors a closed pool
leaves behind (none)."""

from __future__ import annotations

import time

import pytest
from distributed import Client

from daskqueue import ConsumerPool, QueuePool, defaults
from daskqueue.errors import ConfigurationError, NoWorkerError
from tests import tasks
from tests.helpers import wait_until

#: adapt() every 0.2 s; a worker is retired after 3 looks that want it gone (~0.6 s).
ADAPT = dict(interval="200ms", wait_count=3)


def n_workers(client):
    return len(client.scheduler_info(n_workers=-1)["workers"])


def reported_work(client):
    """Whether a queue's latest load report to the scheduler has work in it."""
    def busy(dask_scheduler):
        plugin = dask_scheduler.plugins["daskqueue-membership"]
        return any(load.busy for load in plugin.loads.values())

    return client.run_on_scheduler(busy)


def held_keys(client, keys):
    """Which of ``keys`` the scheduler still holds."""
    keys = list(keys)
    return client.run_on_scheduler(lambda dask_scheduler: [k for k in keys if k in dask_scheduler.tasks])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("durability", ["transient", "durable"])
def test_pools_made_with_no_worker_ask_adapt_for_one_and_run_a_map(cluster_factory, tmp_path, durability):
    cluster, client = cluster_factory(0)
    cluster.adapt(minimum=0, maximum=2, **ADAPT)
    kwargs = {"durability": "durable", "dirpath": tmp_path / "pool"} if durability == "durable" else {}
    qp = QueuePool(client, 2, **kwargs)  # no worker yet: it returns at once
    # One consumer per worker, or (durable here) a fixed pool placed once workers join.
    cp = ConsumerPool(client, qp, n_consumers=2 if durability == "durable" else None)
    cp.start()
    assert qp.map(tasks.double, range(50), timeout_s=60) == [2 * i for i in range(50)]
    assert n_workers(client) >= 1
    assert not qp.table.resting
    assert cp.failures() == {}
    if durability == "durable":
        wait_until(lambda: cp.n_consumers == 2, timeout_s=30, interval_s=0.1)
    cp.close()
    qp.close()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("durability", ["transient", "durable"])
def test_an_idle_pool_lets_adapt_retire_the_last_worker_and_its_outcomes_wait(cluster_factory, tmp_path,
                                                                             durability):
    """Work that ran but whose outcomes the client has not fetched yet rests with the pool
    (in the parked state, or in the directory) and comes back with the next worker."""
    cluster, client = cluster_factory(1)
    kwargs = {"durability": "durable", "dirpath": tmp_path / "pool"} if durability == "durable" else {}
    qp = QueuePool(client, 2, **kwargs)
    cp = ConsumerPool(client, qp)
    cp.start()
    ids = qp.batch_submit([(tasks.double, i) for i in range(40)])
    wait_until(lambda: sum(s.pending for s in qp.stats()) == 0, timeout_s=30)  # ran; not fetched
    cluster.adapt(minimum=0, maximum=1, **ADAPT)

    wait_until(lambda: n_workers(client) == 0, timeout_s=30, interval_s=0.1)
    assert set(qp.table.resting) == {0, 1}

    # Waking the pool starts a worker (the results are on it). Not asserted by counting the
    # workers after: idle again, adapt (0.6 s here) may already have retired it (CI saw 0).
    assert [qp.result(i, timeout_s=60) for i in ids] == [2 * i for i in range(40)]  # wakes the pool
    assert qp.map(tasks.double, range(20), timeout_s=60) == [2 * i for i in range(20)]
    assert cp.failures() == {}
    cp.close()
    qp.close()


@pytest.mark.timeout(60)
def test_a_backlog_report_does_not_outlive_the_work(cluster_factory, monkeypatch):
    """A queue reports its backlog while it has work; the report that had work must not
    stand once the work is done (adapt would start a worker for nothing), and a burst shorter
    than the interval to the second report starts none. Workers in this process, so that
    the queue reports at once (sweeps every 50 ms) and then not for 30 s."""
    from daskqueue import scheduler_plugin
    from daskqueue.queue import sweeper

    monkeypatch.setattr(sweeper, "ORPHAN_CHECK_S", 0.05)
    monkeypatch.setattr(sweeper, "LOAD_REPORT_S", 30.0)
    monkeypatch.setattr(sweeper, "LOAD_CONFIRM_S", 30.0)
    # Nor does the scheduler drop a report for its age (10 s) while the test looks: only the
    # queue's own report can say the work is done.
    monkeypatch.setattr(scheduler_plugin, "LOAD_STALE_S", 60.0)
    cluster, client = cluster_factory(1, processes=False)
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp, isolation="thread")
    cp.start()
    cluster.adapt(minimum=1, maximum=2, interval="100ms", wait_count=3)

    assert qp.batch_submit([(tasks.sleep_then, i, 0.02) for i in range(20)])
    wait_until(lambda: reported_work(client), timeout_s=10)  # the queue told the scheduler of its work
    wait_until(lambda: qp.stats()[0].pending == 0, timeout_s=30)
    # ...and that it is done: at the settle that emptied it, not at the next report 30 s away
    # (10 s: a loaded machine's slack).
    wait_until(lambda: not reported_work(client), timeout_s=10, interval_s=0.05)
    seen = [len(cluster.plan)]
    deadline = time.monotonic() + 2.0  # adapt looks 20 times meanwhile
    while time.monotonic() < deadline:
        seen.append(len(cluster.plan))
        time.sleep(0.05)
    assert max(seen) == 1, "a worker was asked for by a stale backlog report"
    cp.close()
    qp.close()


@pytest.mark.timeout(60)
def test_a_cluster_with_no_worker_that_cannot_grow_says_what_to_do(cluster_factory):
    cluster, client = cluster_factory(0)  # no adapt, no worker asked for
    with pytest.raises(ConfigurationError, match=r"adapt\(minimum=0"):
        QueuePool(client, 1)


@pytest.mark.timeout(60)
def test_a_put_to_a_pool_that_gets_no_worker_raises_no_worker_error(cluster_factory, monkeypatch):
    """A client that knows its scheduler only by address cannot tell whether workers will
    come: the pool waits for one, and a call gives up after ``WORKER_WAIT_S``."""
    cluster, _ = cluster_factory(0)
    monkeypatch.setattr(defaults, "WORKER_WAIT_S", 1.0)
    with Client(cluster.scheduler_address) as client:
        qp = QueuePool(client, 1)
        started = time.monotonic()
        with pytest.raises(NoWorkerError, match="cluster.adapt") as info:
            qp.put_many([1, 2, 3])
        assert info.value.queue_index == 0
        assert time.monotonic() - started < 20
        qp.close()


@pytest.mark.timeout(60)
def test_closed_pools_release_their_actors(client, pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=2)
    keys = [f.key for f in qp.table.futures] + [m.future.key for m in cp.members.members]
    assert len(held_keys(client, keys)) == 4
    cp.close()
    qp.close()
    wait_until(lambda: not held_keys(client, keys), timeout_s=10, interval_s=0.1)
