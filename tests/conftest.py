"""Shared fixtures: one real LocalCluster (2 worker processes x 1 thread) per test session.

Tests that kill workers make their own cluster; everything else shares this one and closes the
pools it creates.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import sys
import warnings

import dask
import pytest
from distributed import Client, LocalCluster
from distributed.utils import get_mp_context

# Bytecode is cached for the suite's processes even where PYTHONDONTWRITEBYTECODE is set (this
# machine sets it): the suite starts hundreds of Python processes that import daskqueue (each
# process-isolated consumer's child, the CLI's and scripts' workers, the forkservers), and
# without a cache each compiles the package from source again (~0.1 s of CPU per child process,
# measured), and each xdist worker rewrites every test module's asserts anew. The processes
# started from here on (xdist's workers, and theirs) inherit this; the caches are
# ``__pycache__`` directories, ignored by git.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# Worker processes fork from one warm process per test process (``forkserver``, which
# distributed preloads with itself and its dependencies) instead of each starting a new
# interpreter that imports Dask (``spawn``, the default): about 1 s of CPU less per worker
# started, and the suite starts ~100 of them on 2 cores. Workers still are processes of
# their own (killed, retired and restarted as with spawn); like spawn, they inherit no
# state of the test process (the forkserver is a fresh interpreter). The forkserver also
# preloads the modules of daskqueue's actors (0.25 s of CPU per worker otherwise):
# distributed sets its own preload list at its first ``get_mp_context``, so that call comes
# first and this list, which starts with distributed, replaces it.
dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
get_mp_context()
multiprocessing.get_context("forkserver").set_forkserver_preload(
    ["distributed", "daskqueue.queue.transient", "daskqueue.queue.durable", "daskqueue.consumer.general",
     "daskqueue.queue.pool", "daskqueue.consumer.pool"])


@pytest.fixture(scope="session")
def cluster():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        _shared["cluster"] = cluster
        yield cluster
        _shared.clear()


SHARED_WORKERS = 2

#: The session's shared cluster once a test made it (read by the watch below, which must not
#: make it for tests that do not use it).
_shared: dict = {}


def _shared_addresses():
    """The shared cluster's workers as its scheduler (in this process) sees them; None before
    the cluster exists. Read without a call: the scheduler's loop thread may be changing them."""
    cluster = _shared.get("cluster")
    if cluster is None:
        return None
    for _ in range(10):
        try:
            return set(cluster.scheduler.workers)
        except RuntimeError:  # changed size while copied: copy again
            continue
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    item._shared_workers_before = _shared_addresses()  # after setup: the client guard restored them
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    """Any test, whichever fixtures it uses, that the shared cluster lost or replaced a worker
    during (its run and teardown) is named: CI once saw a one-worker shared cluster and no
    test said so."""
    yield
    before, after = getattr(item, "_shared_workers_before", None), _shared_addresses()
    if before is not None and after is not None and before != after:
        warnings.warn(f"the shared cluster's workers changed during {item.nodeid}: lost {sorted(before - after)}, "
                      f"new {sorted(after - before)}", stacklevel=2)


@pytest.fixture(scope="session")
def _shared_client(cluster):
    with Client(cluster) as client:
        yield client


@pytest.fixture
def client(request, cluster, _shared_client):
    """The session's client, on a cluster that has its ``SHARED_WORKERS`` workers again.

    A test on the shared cluster must not lose a worker; if one did anyway (a worker that
    died under load and was not restarted), the next test would see a smaller cluster and
    fail for a reason of someone else's. Restore the shape and name the test that broke it.
    A worker replaced during a test (died, and its nanny started a new one under a new
    address) is named too: the next test might have run in the gap.
    """
    before = _restore_shared_workers(cluster, _shared_client, before=request.node.nodeid)
    yield _shared_client
    after = _restore_shared_workers(cluster, _shared_client, after=request.node.nodeid)
    replaced = before - after
    if replaced:
        warnings.warn(f"the shared cluster's workers {sorted(replaced)} were replaced during "
                      f"{request.node.nodeid}", stacklevel=2)


def _restore_shared_workers(cluster, client, *, before=None, after=None):
    """Give the shared cluster its ``SHARED_WORKERS`` workers back if it lacks some (with a
    warning); return their addresses."""
    # Asked of the scheduler: Client.scheduler_info() answers from a cache that the client's
    # periodic refresh (n_workers=0) can leave without workers, which read as "0 workers".
    workers = set(client.sync(client.scheduler.identity, n_workers=-1)["workers"])
    if len(workers) == SHARED_WORKERS:
        return workers
    where = f"after {after}" if after else f"before {before}"
    warnings.warn(f"the shared cluster had {len(workers)} workers, not {SHARED_WORKERS}, {where}: restored",
                  stacklevel=2)
    cluster.scale(SHARED_WORKERS)
    client.wait_for_workers(SHARED_WORKERS, timeout=60)
    return set(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


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


@pytest.fixture(autouse=True)
def _daskqueue_logger_as_it_was():
    """Put the ``daskqueue`` logger back as it was after each test: 0.2.0 spellings
    (``daskqueue.utils.logger``, ``join(progress=True)``) give it a printing handler at INFO,
    and a level left at INFO would have every later test's log capture hold its records
    (and through their arguments, the pools and clients they name)."""
    import logging

    from daskqueue import compat

    log = logging.getLogger("daskqueue")
    handlers, level = list(log.handlers), log.level
    yield
    for handler in [h for h in log.handlers if h not in handlers]:
        log.removeHandler(handler)
    log.setLevel(level)
    compat._handler = None


#: Test files whose tests are the suite's longest, with the seconds their tests take together
#: in a full ``-n 3`` run (from ``--durations``; rough: only their order and size matter).
#: They start first, spread over the xdist workers (see ``pytest_collection_modifyitems``), so
#: that no worker starts one of them near the end and holds the whole run up for it.
LONG_FIRST = {
    "tests/queue/test_compaction_off_loop.py": 55,
    "tests/test_membership.py": 50,
    "tests/consumer/test_elastic.py": 55,
    "tests/compat/test_readme_and_examples.py": 45,
    "tests/test_attach_moved.py": 45,
    "tests/test_cli_map.py": 45,
    "tests/consumer/test_faults.py": 35,
    "tests/test_joblib_backend.py": 35,
    "tests/test_scheduler_lost.py": 35,
    "tests/consumer/test_walltime_cluster.py": 28,
    "tests/test_preemption.py": 24,
    # Less now (~20 s), but early: its thread case leaves a 60 s sleep on a shared worker,
    # which a session ending soon after waits for when it closes the cluster (~4 s).
    "tests/consumer/test_time_limits.py": 35,
    "tests/test_client_restart.py": 20,
    "tests/segment/test_machine.py": 20,
    "tests/test_retire_settles.py": 17,
    "tests/compat/test_users_fixtures.py": 16,
}


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Tell each xdist worker the run's ``--dist`` mode: xdist sets the worker's own to "no"
    (it runs what it is sent), and the order below depends on the controller's."""
    node.workerinput["daskqueue_dist"] = node.config.getoption("dist", "no")


@pytest.hookimpl(trylast=True)  # after ``-m``/``-k`` deselected: the slices are of what runs
def pytest_collection_modifyitems(config, items):
    """Long tests first, and under ``--dist worksteal`` spread so that each xdist worker
    starts on its share of them.

    worksteal hands worker ``i`` of ``n`` the ``i``-th contiguous slice of the collection at
    the start (sizes ``len(pending) // (n - i)``), and an idle worker later steals the tail of
    the longest queue. A plain long-first order would put every long test in the first
    worker's slice: one worker runs them all, one after the other (CI saw that worker end
    last, on its ~30 long tests, while the others stole its short tail). So the long tests
    are dealt to the slices longest first, each to the slice with the fewest seconds so far,
    and the short tests fill each slice up to its size, in collection order.
    """
    paths = {item.nodeid: item.nodeid.split("::", 1)[0] for item in items}
    per_file = collections.Counter(paths.values())
    weight = {nodeid: LONG_FIRST[path] / per_file[path] for nodeid, path in paths.items() if path in LONG_FIRST}
    long_items = sorted((i for i in items if i.nodeid in weight), key=lambda i: -weight[i.nodeid])
    short_items = [i for i in items if i.nodeid not in weight]
    workerinput = getattr(config, "workerinput", {})
    n = int(workerinput.get("workercount", 1))
    if n <= 1 or workerinput.get("daskqueue_dist") != "worksteal":
        items[:] = long_items + short_items
        return
    sizes, left = [], len(items)
    for i in range(n):  # worksteal's first hand-out: each worker the same share of what is left
        sizes.append(left // (n - i))
        left -= sizes[-1]
    slices: list[list] = [[] for _ in range(n)]
    seconds = [0.0] * n
    for item in long_items:
        open_slices = [j for j in range(n) if len(slices[j]) < sizes[j]]
        j = min(open_slices, key=lambda j: seconds[j])
        slices[j].append(item)
        seconds[j] += weight[item.nodeid]
    rest = iter(short_items)
    for j in range(n):
        slices[j].extend(next(rest) for _ in range(sizes[j] - len(slices[j])))
    items[:] = [item for piece in slices for item in piece]
