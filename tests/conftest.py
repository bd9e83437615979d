"""Shared fixtures: one real LocalCluster (2 worker processes x 1 thread) per test session.

Tests that kill workers make their own cluster; everything else shares this one and closes the
pools it creates.
"""

from __future__ import annotations

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
FORKSERVER_PRELOAD = ["distributed", "daskqueue.queue.transient", "daskqueue.queue.durable",
                      "daskqueue.consumer.general", "daskqueue.queue.pool", "daskqueue.consumer.pool"]
dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
get_mp_context()
multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)


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
def _sigint_as_python_sets_it():
    """Ctrl-C raises KeyboardInterrupt in every test, whatever an earlier test in the same
    process left installed (importing ``dask_jobqueue.runner`` sets a SIGINT handler that
    calls ``sys.exit()``); the handler found is put back after the test."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


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


#: The suite's longest tests, by node id prefix (a file, a test, or a test with all its
#: parameters), with the seconds EACH test the prefix names takes in a full ``-n 3`` run (from
#: ``--durations`` on a lightly loaded machine; rough: only their order and size matter; the
#: longest prefix that matches wins). They start first, spread over the xdist workers (see
#: ``pytest_collection_modifyitems``), so that no worker starts one of them near the end and
#: holds the whole run up for it. Refresh from ``--durations=60`` when tests change.
LONG_FIRST = {
    "tests/consumer/test_walltime_cluster.py": 16,
    "tests/compat/test_readme_and_examples.py::test_a_script_that_never_closes": 16,
    "tests/test_retire_settles.py::test_leases_fetched_ahead": 14,
    "tests/queue/test_compaction_off_loop.py::test_automatic_compaction": 13.5,
    "tests/test_scheduler_lost.py::test_losing_the_scheduler": 13,
    "tests/test_cli_map.py::test_stats_and_dead_letters": 12.5,
    "tests/compat/test_users_fixtures.py": 12.4,
    "tests/test_preemption.py::test_a_job_killed_mid_map_with_no_replacement_does_not_hang_the_map[3]": 12.2,
    "tests/test_membership.py::test_a_backlog_scales_a_dask_jobqueue_cluster": 11,
    "tests/consumer/test_elastic.py::test_churn": 11.4,
    "tests/test_client_restart.py::test_a_new_client_reopens": 10.5,
    "tests/test_cli_map.py::test_a_durable_map_killed_halfway": 10,
    "tests/queue/test_compaction_off_loop.py::test_on_a_cluster": 9.7,
    "tests/compat/test_old_logger.py::test_the_old_logger_and_join_progress_print": 9.2,
    "tests/test_joblib_backend.py::test_scikit_learn": 8.6,
    "tests/test_preemption.py::test_a_job_killed_mid_map_with_no_replacement_does_not_hang_the_map[2]": 8.6,
    "tests/consumer/test_resize.py::test_add_queues_under_load": 8.4,
    "tests/queue/test_eta.py::test_a_durable_messages_due_time_survives_a_restart": 8.1,
    "tests/test_membership.py::test_a_backlog_scales_the_cluster_up": 7.5,
    "tests/test_cli_map.py::test_map_gives_the_pool_the_default_number": 7.3,
    "tests/test_submission_faults2.py::test_a_map_gets_the_outcomes_of_its_tasks_moved": 7.3,
    "tests/test_lane.py::test_many_threads_share_one_lane": 7.2,
    "tests/test_cli_map.py::test_map_writes_results_in_input_order": 7.1,
    "tests/test_submission_faults.py::test_a_long_map_routes_its_remaining_puts": 6.8,
    "tests/test_lane.py::test_a_killed_consumer_worker_loses_no_message": 14,
    "tests/queue/test_deadlines.py::test_a_queue_whose_event_loop_is_blocked": 6.9,
    "tests/consumer/test_elastic.py::test_a_durable_queues_killed_worker": 6.7,
    "tests/queue/test_function_eviction.py::test_ten_thousand": 6.7,
    "tests/segment/test_machine.py::TestDurableQueueMachine": 6.5,
    "tests/consumer/test_elastic.py::test_a_killed_consumers_leases_come_back": 6.2,
    "tests/test_cli.py::test_bench_runs": 6.1,
    "tests/test_cli_map.py::test_a_bad_function_or_input": 5.9,
    "tests/queue/test_durable_pool.py::test_killed_durable_queue_worker": 5.8,
    "tests/test_attach_moved.py::test_a_producer_in_another_process": 5.5,
    "tests/consumer/test_elastic.py::test_a_task_that_kills_its_process": 5.4,
    "tests/consumer/test_time_limits.py::test_a_task_that_cannot_be_interrupted": 4.5,
    "tests/consumer/test_scheduling.py::test_a_reserved_slot_starts_an_urgent_task": 5,
    "tests/consumer/test_pool.py::test_idle_consumers_long_poll": 5,
    "tests/test_cli_map.py::test_map_reads_json_from_stdin": 5,
    "tests/test_warm.py::test_every_worker_present_and_joining_later": 4.9,
    "tests/test_membership.py::test_retiring_a_queues_worker": 4.5,
    "tests/test_executor.py::test_a_lost_transient_queue": 4.5,
    "tests/test_cli.py::test_demo_runs": 4.5,
    "tests/test_nested.py::test_the_documents_and_pages_example": 4.4,
    "tests/consumer/test_pool.py::test_an_idle_consumer_asks_only_its_home_queue": 4.4,
    "tests/test_adapt_backlog.py::test_a_backlog_counts_at_the_first_settle": 4.3,
    "tests/consumer/test_scheduling.py::test_fair_share_starts_a_late_small_type": 4.2,
    "tests/consumer/test_faults.py::test_killed_consumer_leases_are_redelivered": 4.2,
    "tests/test_client_restart.py::test_a_pool_that_never_got_a_call": 4.1,
    "tests/queue/test_core_machine.py::TestQueueCoreMachine": 3.5,
}


def _long_first_seconds(nodeid: str) -> float | None:
    """``LONG_FIRST``'s seconds for the test ``nodeid`` (its longest matching prefix), or None."""
    matches = [prefix for prefix in LONG_FIRST if nodeid.startswith(prefix)]
    return LONG_FIRST[max(matches, key=len)] if matches else None


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
    weight = {item.nodeid: seconds for item in items
              if (seconds := _long_first_seconds(item.nodeid)) is not None}
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
