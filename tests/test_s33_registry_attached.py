"""An attached handle reads where its pool's queues are from the registry (on the scheduler).
A queue that moved off a retiring worker (a SLURM job at its walltime) must not look removed
to it: the owner registers the successor, or that the queue rests in the owner's client
waiting for a worker, before it frees the old actor; a call that reaches the freed actor
follows the registry (a hand-off), and a call to a resting queue waits for it.

Before: the registry named the freed actor (while the queue was parked, and during the
successor's install), and the handle's call there raised "queue 0 ... was removed by its
owner" and dropped the queue for good."""

from __future__ import annotations

import threading

import pytest
from distributed import Client

from daskqueue import NoWorkerError, QueuePool, defaults, registry
from daskqueue.errors import PoolClosedError, QueueHandedOffError
from tests import tasks
from tests.helpers import wait_until


def _holds(client, handle) -> bool:
    key = handle.key
    held = client.run(lambda dask_worker: key in dask_worker.state.actors, workers=[handle._address])
    return bool(held.get(handle._address))


@pytest.fixture
def other_client(client):
    """A second client of the session's cluster, as an attached producer elsewhere has (its
    handles do not hold the owner's actors)."""
    with Client(client.scheduler.address, set_as_default=False) as other:
        yield other


def _attached_demands(client) -> set:
    def demands(dask_scheduler):
        return {k for p in dask_scheduler.plugins.values() for k in getattr(p, "demand", {}) if "attached" in k[0]}

    return client.run_on_scheduler(demands)


@pytest.mark.timeout(60)
def test_the_registry_names_a_successor_before_the_old_actor_is_freed(client, pools):
    qp = pools.queue(1)
    old = qp.queues[0]
    named = []

    class Consumers:  # told after the install, before the old actor is freed
        def on_queue_moved(self, q, handle):
            named.append(registry.registered_pool(client, qp.name)["queues"][str(q)][2])

    qp.consumer_pools = lambda: [Consumers()]
    qp.follower.hand_off(0)
    assert named == [qp.queues[0].key] and named[0] != old.key


@pytest.mark.timeout(90)
def test_an_attached_call_that_reaches_a_moved_queues_freed_actor_follows_the_queue(client, other_client, pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    ah = QueuePool.attach(other_client, qp.name)
    try:
        old = qp.queues[0]
        qp.follower.hand_off(0)
        wait_until(lambda: not _holds(client, old), timeout_s=30)
        assert ah.table.handles[0].key == old.key  # not followed yet: its next call reaches the freed actor
        with pytest.raises(QueueHandedOffError):  # before: QueueClosedError "... removed by its owner"
            ah.table.answer(0, ah.table.call(0, "stats"))
        assert 0 not in ah.table.removed and ah.table.handles[0].key == qp.queues[0].key
        assert ah.map(tasks.double, [1, 2, 3]) == [2, 4, 6]
    finally:
        ah.close()


@pytest.mark.timeout(90)
def test_an_attached_handle_waits_for_a_parked_queue_and_puts_there_once_it_starts(
        client, other_client, pools, monkeypatch):
    qp = pools.queue(1)
    ah = QueuePool.attach(other_client, qp.name)
    try:
        old = qp.queues[0]
        qp.follower.placeable_for = lambda q: []  # every worker retiring: the state parks in the client
        qp.follower.hand_off(0)
        assert 0 in qp.table.resting
        wait_until(lambda: not _holds(client, old), timeout_s=30)
        entry = registry.registered_pool(client, qp.name)
        assert list(entry["resting"]) == [0] and "0" not in entry["queues"]  # before: named the freed actor

        monkeypatch.setattr(defaults, "WORKER_WAIT_S", 2.0)
        with pytest.raises(NoWorkerError):  # before: QueueClosedError "... removed by its owner"
            ah.submit(tasks.double, 1)
        assert 0 not in ah.table.removed
        assert not _attached_demands(client)  # its ask for a worker ended with the wait

        monkeypatch.setattr(defaults, "WORKER_WAIT_S", 60.0)
        put = {}
        thread = threading.Thread(target=lambda: put.update(id=ah.submit(tasks.double, 2)))
        thread.start()
        wait_until(lambda: _attached_demands(client), timeout_s=10)  # it waits, and asked for a worker
        del qp.follower.placeable_for
        qp.follower.wake(0)  # a worker can take it: the owner starts it there
        thread.join(timeout=30)
        assert "id" in put
        assert qp.stats()[0].pending == 1
        assert not _attached_demands(client)
    finally:
        ah.close()


@pytest.mark.timeout(60)
def test_a_queue_released_because_its_owners_client_went_away_is_a_closed_pool_not_a_removed_queue(
        client, other_client, monkeypatch):
    owner = QueuePool(other_client, 1)
    ah = QueuePool.attach(client, owner.name)
    try:
        old = owner.queues[0]
        other_client.close()  # the owner's client dies with the pool open: its actors are released
        wait_until(lambda: not _holds(client, old), timeout_s=30)
        assert registry.registered_pool(client, owner.name) is not None  # its entry stays
        monkeypatch.setattr(defaults, "MOVE_WAIT_S", 1.0)
        with pytest.raises(PoolClosedError):  # before: QueueClosedError "... removed by its owner"
            ah.stats()
        assert 0 not in ah.table.removed
    finally:
        ah.close()
        owner.close()  # its client is gone: it only forgets itself
        client.sync(client.scheduler.set_metadata, keys=[registry.POOLS_KEY, owner.name], value=None)
