"""Workers load the queue actors' modules before a queue moves to them (daskqueue/warm.py).

The suite's workers fork from a forkserver that preloads those modules (tests/conftest.py),
which would hide the cost; this test's cluster spawns fresh interpreters, as a user's does.
"""

from __future__ import annotations

import sys

import dask
import pytest
from distributed import Client, LocalCluster

from tests.helpers import wait_until

MODULE = "daskqueue.queue.durable"  # a transient pool's own queue never imports it


def _loaded() -> bool:
    return MODULE in sys.modules


@pytest.mark.timeout(120)
def test_every_worker_present_and_joining_later_loads_the_queue_modules_once_a_pool_exists() -> None:
    from daskqueue import QueuePool  # here: the workers import this module (for _loaded), not the pool's

    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            assert not any(client.run(_loaded).values())  # a fresh worker: nothing loaded yet
            qp = QueuePool(client, 1)
            try:
                wait_until(lambda: all(client.run(_loaded).values()), timeout_s=60)
                cluster.scale(2)
                client.wait_for_workers(2, timeout=60)
                wait_until(lambda: len(client.run(_loaded)) == 2 and all(client.run(_loaded).values()),
                           timeout_s=60)
            finally:
                qp.close()


@pytest.mark.timeout(60)
def test_a_scheduler_that_never_answers_a_plugin_registration_fails_it_in_bounded_time(cluster_factory) -> None:
    """``Client.register_plugin`` takes no deadline: a scheduler that took the request and
    never answered held a pool's opening for good (it registers the warm-up and membership
    plugins). The scheduler's handler is made to hang; the registration raises in time."""
    import time

    from daskqueue.scheduler_query import register_plugin
    from daskqueue.warm import WarmWorkers

    cluster, client = cluster_factory(1)

    def hang_plugin_registrations(dask_scheduler):
        import asyncio

        async def never(*args, **kwargs):
            await asyncio.sleep(3600)

        dask_scheduler.handlers["register_worker_plugin"] = never

    client.run_on_scheduler(hang_plugin_registrations)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        register_plugin(client, WarmWorkers(), timeout_s=2.0)
    assert time.monotonic() - started < 15
