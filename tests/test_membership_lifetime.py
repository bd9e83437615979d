"""A client's membership (its thread, and the reference to the Client it holds) lives as long
as the client's pools: the last pool to close stops it."""

from __future__ import annotations

import threading

from distributed import Client

from daskqueue import ConsumerPool, QueuePool
from tests.helpers import wait_until


def membership_threads() -> int:
    return sum(t.name == "daskqueue-membership" and t.is_alive() for t in threading.enumerate())


def test_the_last_pool_of_a_client_to_close_stops_its_membership(cluster):
    before = membership_threads()
    with Client(cluster) as client:
        qp = QueuePool(client, 1)
        cp = ConsumerPool(client, qp, n_consumers=1)
        assert membership_threads() == before + 1  # one per client, shared by its pools
        cp.close()
        assert membership_threads() == before + 1  # the queue pool still follows the cluster
        qp.close()
        wait_until(lambda: membership_threads() == before, timeout_s=30)
        qp2 = QueuePool(client, 1)  # a new pool on the same client follows it again
        assert membership_threads() == before + 1
        qp2.close()
    wait_until(lambda: membership_threads() == before, timeout_s=30)
