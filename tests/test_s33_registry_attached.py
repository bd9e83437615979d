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
