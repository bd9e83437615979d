"""Shared fixtures: one real LocalCluster (2 worker processes x 1 thread) per test session.

Tests that kill workers make their own cluster; everything else shares this one and closes the
pools it creates.
"""

from __future__ import annotations

import pytest
from distributed import Client, LocalCluster


@pytest.fixture(scope="session")
def cluster():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def client(cluster):
    with Client(cluster) as client:
        yield client


@pytest.fixture
def cluster_factory():
    """Make fresh clusters (``make(n_workers, **LocalCluster options)`` -> cluster, client)
    for tests that kill, add or retire workers; all closed after the test."""
    made = []

    def make(n_workers, **kwargs):
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=None, **kwargs)
        client = Client(cluster)
        made.append((cluster, client))
        return cluster, client

    yield make
    for cluster, client in reversed(made):
        client.close()
        cluster.close()


@pytest.fixture
def pools(client):
    """Create pools with ``pools.queue(...)`` / ``pools.consumer(...)``; closed after the test."""
    from daskqueue import ConsumerPool, QueuePool

    class Pools:
        def __init__(self):
            self.made = []

        def queue(self, n_queues=2, **kwargs):
            qp = QueuePool(client, n_queues, **kwargs)
            self.made.append(qp)
            return qp

        def consumer(self, queue_pool, **kwargs):
            cp = ConsumerPool(client, queue_pool, **kwargs)
            self.made.append(cp)
            return cp

    p = Pools()
    yield p
    for pool in reversed(p.made):
        try:
            pool.close()
        except Exception:
            pass
