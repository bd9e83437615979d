"""A worker that joins or leaves while a pool starts is a change the pool hears of.

A pool places its actors by the workers it sees as it starts, and listens to the cluster's
membership only once they are up. Before, a change in between (the membership thread saw
it, told the pools listening then, and moved on) never reached the starting pool: a
consumer pool of one consumer per worker had none on a worker that joined during its
start, for good; one that lost a consumer's worker then kept counting it. Now the pool is
given what changed between the view it started from and the moment it listens, before
any later change.

The window is widened by wrapping our own ``Members.await_members`` (the consumers are
up, the pool not yet listening): the cluster, its workers and the membership are real.
"""

from __future__ import annotations

import pytest
from distributed import Client, LocalCluster

from daskqueue import ConsumerPool, QueuePool
from daskqueue.consumer.members import Members
from tests import tasks
from tests.helpers import kill_worker, wait_until


def _cluster(n: int) -> LocalCluster:
    return LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=None, processes=True)


def _addresses(cp: ConsumerPool) -> set[str]:
    with cp.members.lock:
        return {m.address for m in cp.members.members}


def _started_with(monkeypatch, client, qp: QueuePool, meanwhile, **options) -> ConsumerPool:
    """A ``ConsumerPool`` whose ``meanwhile(members)`` runs once its consumers are up and
    before the pool listens to the membership (the window this file is about)."""
    original = Members.await_members

    def up_then(self, spawned):
        members = original(self, spawned)
        meanwhile(members)
        return members

    monkeypatch.setattr(Members, "await_members", up_then)
    try:
        return ConsumerPool(client, qp, **options)
    finally:
        monkeypatch.undo()


def _runs_tasks(cp: ConsumerPool, qp: QueuePool) -> None:
    cp.start()
    assert qp.map(tasks.double, range(20)) == [2 * x for x in range(20)]


@pytest.mark.timeout(120)
def test_a_worker_that_joins_while_a_pool_of_one_consumer_per_worker_starts_gets_one(monkeypatch):
    with _cluster(1) as cluster, Client(cluster) as client:
        qp = QueuePool(client, 1)
        cp = None
        try:
            started_on = []

            def a_worker_joins(members):
                started_on.extend(m.address for m in members)
                cluster.scale(2)
                client.wait_for_workers(2, timeout=60)
                # the membership thread has seen it, and told every pool listening then
                wait_until(lambda: len(qp.membership.workers) == 2, timeout_s=30)

            cp = _started_with(monkeypatch, client, qp, a_worker_joins)
            assert len(started_on) == 1
            workers = set(client.scheduler_info(n_workers=-1)["workers"])
            wait_until(lambda: _addresses(cp) == workers, timeout_s=30)
            assert cp.n_consumers == 2
            _runs_tasks(cp, qp)
        finally:
            if cp is not None:
                cp.close()
            qp.close()


@pytest.mark.timeout(120)
def test_a_consumer_whose_worker_dies_while_its_pool_starts_is_replaced(monkeypatch):
    with _cluster(2) as cluster, Client(cluster) as client:
        qp = QueuePool(client, 1)
        cp = None
        try:
            gone = []

            def a_worker_dies(members):
                # the worker without the queue: its consumer is what is lost
                victim = next(m.address for m in members if m.address != qp.table.handles[0]._address)
                gone.append(victim)
                kill_worker(client, victim)  # (its nanny starts another, on another address)
                wait_until(lambda: victim not in qp.membership.workers, timeout_s=30)

            cp = _started_with(monkeypatch, client, qp, a_worker_dies, n_consumers=2)
            (victim,) = gone
            # the lost consumer is forgotten and replaced
            wait_until(lambda: cp.n_consumers == 2 and victim not in _addresses(cp), timeout_s=30)
            assert _addresses(cp) <= set(client.scheduler_info(n_workers=-1)["workers"])
            _runs_tasks(cp, qp)
        finally:
            if cp is not None:
                cp.close()
            qp.close()
