"""A user's test suite built on ``distributed.utils_test`` (point 11 of issue 22), run by
``test_users_fixtures.py`` in a pytest of its own: its ``client`` fixture checks at teardown
that no thread outlives the test, and terminates every child process of the test process
(so it must not share a process with this suite's shared cluster). Pools made in such tests,
closed or left open as 0.2.0's own tests left them, leave no daskqueue thread behind once
the client closes. (Named so that this suite's pytest does not collect it.)"""

from __future__ import annotations

import multiprocessing
import threading
import warnings

import pytest
from distributed.utils_test import cleanup, client, cluster_fixture, loop, loop_in_thread  # noqa: F401

from tests.compat import old_code
from tests.conftest import FORKSERVER_PRELOAD
from tests.helpers import wait_until

# The fixtures' cluster processes (a scheduler and two workers per test) run functions of
# ``distributed.utils_test``, which imports pytest and dask.array: those two are preloaded in
# the forkserver the processes fork from (tests/conftest.py), not imported again by each
# (~0.9 s of CPU each, 9 processes). Not ``distributed.utils_test`` itself: importing it
# starts Dask's offload thread, which a forked process would not have.
multiprocessing.get_context("forkserver").set_forkserver_preload([*FORKSERVER_PRELOAD, "dask.array", "pytest"])

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from daskqueue.ConsumerPool import ConsumerPool
    from daskqueue.QueuePool import QueuePool


def daskqueue_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("daskqueue")]


@pytest.mark.timeout(180)
def test_pools_left_open_as_the_original_tests_did(client):
    """The thread-leak check of the ``client`` fixture is this test's assertion."""
    queue_pool = QueuePool(client, 1)
    consumer_pool = ConsumerPool(client, queue_pool=queue_pool, n_consumers=2)
    for _ in range(10):
        queue_pool.submit(old_code.add, 1, 1)
    consumer_pool.start()
    consumer_pool.join()
    res = consumer_pool.results()
    assert 10 * [2] == [v for k in res for v in res[k].values()]


@pytest.mark.timeout(180)
def test_closing_the_pools_ends_the_membership_thread_at_once(client):
    queue_pool = QueuePool(client, 1)
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=1)
    assert any(t.name == "daskqueue-membership" for t in daskqueue_threads())
    consumer_pool.close()
    queue_pool.close()
    assert not [t for t in daskqueue_threads() if t.name == "daskqueue-membership"]


@pytest.mark.timeout(180)
def test_closing_the_client_ends_the_thread_of_pools_left_open(client):
    queue_pool = QueuePool(client, 1)
    queue_pool.put_many([1, 2])
    client.close()
    wait_until(lambda: not daskqueue_threads(), timeout_s=4)  # distributed's check waits 5 s
