"""Shared fixtures: one real LocalCluster (2 worker processes x 1 thread) per test session.

Tests that kill workers make their own cluster; everything else shares this one and closes the
pools it creates.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fixed_port_client():
    """A client of a cluster of two nanny workers, each on a fixed port of its own: a worker
    killed there is restarted by its nanny under the address it died with."""
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {i: {"cls": Nanny, "options": {"nthreads": 1, "host": "127.0.0.1", "worker_port": _free_port(),
                                             "dashboard_address": None}} for i in range(2)}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": None}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        yield client


@pytest.fixture
def jobs():
    """``start(n)``: ``n`` ``dask worker`` jobs on a fresh scheduler, each a process group of
    its own that a kill leaves nothing to restart (see ``tests.helpers.WorkerJobs``)."""
    from tests.helpers import WorkerJobs

    made = WorkerJobs()
    yield made.start
    made.close()


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
#: ``--durations`` on a loaded machine, every test of 4.5 s or more; rough: only their order
#: and size matter; the longest prefix that matches wins). They start first, spread over the xdist workers (see
#: ``pytest_collection_modifyitems``), so that no worker starts one of them near the end and
#: holds the whole run up for it. Refresh from ``--durations=60`` when tests change.
LONG_FIRST = {
    "tests/compat/test_users_fixtures.py::test_a_users_suite_on_distributed_utils_test_fixtures_": 23.8,
    "tests/test_cli_map.py::test_a_durable_map_killed_halfway_resumes_without_redoing_done_": 22.1,
    "tests/segment/test_machine.py::TestDurableQueueMachine::runTest": 20.8,
    "tests/test_joblib_backend.py::test_scikit_learn_cross_val_score_runs_through_the_backend": 20.8,
    "tests/queue/test_compaction_off_loop.py::test_on_a_cluster_a_compacting_queue_does_not_": 20.4,
    "tests/consumer/test_walltime_cluster.py::test_a_worker_reaching_its_lifetime_takes_no_": 19.8,
    "tests/consumer/test_elastic.py::test_churn_every_task_of_a_durable_pool_has_one_result_": 18.6,
    "tests/test_membership.py::test_a_backlog_scales_a_dask_jobqueue_cluster_up_through_its_": 17.6,
    "tests/test_cli_map.py::test_stats_and_dead_letters_find_the_pools_of_a_cluster": 16.4,
    "tests/test_scheduler_lost.py::test_losing_the_scheduler_raises_a_typed_error_soon_and_": 16.4,
    "tests/compat/test_readme_and_examples.py::test_a_script_that_never_closes_its_pools_exits_": 9.0,
    "tests/test_s34_poll_moving_queue_lock.py::test_a_poll_of_a_serving_queue_does_not_wait_behind": 11.0,
    "tests/test_retire_settles.py::test_leases_fetched_ahead_of_a_retired_queue_are_settled_": 14.5,
    "tests/test_cli_map.py::test_map_reads_json_from_stdin_and_writes_unordered_to_stdout": 14.4,
    "tests/test_attach_moved.py::test_a_producer_in_another_process_maps_exactly_while_the_owner_moves_its_messages[add_": 13.9,
    "tests/test_client_restart.py::test_a_new_client_reopens_a_durable_pool_whose_client_was_": 13.8,
    "tests/test_cli_map.py::test_map_writes_results_in_input_order_and_fails_with_the_failed_": 13.7,
    "tests/test_preemption.py::test_a_job_killed_mid_map_with_no_replacement_does_not_hang_": 13.0,
    "tests/queue/test_function_eviction.py::test_ten_thousand_distinct_functions_leave_the_": 12.7,
    "tests/compat/test_old_logger.py::test_the_old_logger_and_join_progress_print": 12.6,
    "tests/test_cli.py::test_bench_runs_a_benchmark_of_the_checkout": 12.5,
    "tests/queue/test_compaction_off_loop.py::test_automatic_compaction_of_a_large_queue_leaves_": 11.3,
    "tests/consumer/test_faults.py::test_killed_consumer_leases_are_redelivered_and_it_is_replaced[durable]": 11.3,
    "tests/consumer/test_elastic.py::test_a_killed_consumers_leases_come_back_at_once_and_it_is_replaced[3]": 10.9,
    "tests/test_zero_workers.py::test_an_idle_pool_lets_adapt_retire_the_last_worker_and_its_outcomes_wait[transient]": 10.0,
    "tests/test_cli_map.py::test_a_bad_function_or_input_is_a_usage_error": 9.7,
    "tests/test_cli.py::test_demo_runs_tasks_and_prints_throughput": 9.4,
    "tests/consumer/test_resize.py::test_add_queues_under_load_moves_keys_in_order_and_loses_": 9.3,
    "tests/test_warm.py::test_every_worker_present_and_joining_later_loads_the_queue_modules_": 9.3,
    "tests/queue/test_durable_pool.py::test_killed_durable_queue_worker_loses_no_acknowledged_": 9.1,
    "tests/test_submission_faults2.py::test_a_map_gets_the_outcomes_of_its_tasks_moved_to_an_": 9.0,
    "tests/test_serialize.py::test_ten_thousand_distinct_lambdas_leave_the_clients_function_": 8.7,
    "tests/queue/test_eta.py::test_a_durable_messages_due_time_survives_a_restart": 8.5,
    "tests/consumer/test_time_limits.py::test_a_task_that_cannot_be_interrupted_does_not_hold_its_slot[process-0]": 8.4,
    "tests/test_cli_map.py::test_map_gives_the_pool_the_default_number_of_queues_of_the_scale_": 8.4,
    "tests/test_fixes5_rest.py::test_empty_rounds_reach_a_poll_interval_in_a_bounded_number_": 8.3,
    "tests/test_membership.py::test_retiring_a_queues_worker_moves_the_queue_and_loses_nothing[durable]": 8.3,
    "tests/consumer/test_elastic.py::test_a_durable_queues_killed_worker_is_reopened_elsewhere_": 8.1,
    "tests/test_submission_faults.py::test_a_long_map_routes_its_remaining_puts_elsewhere_while_a_queue_is_removed[map]": 8.0,
    "tests/queue/test_move.py::test_across_a_move_each_key_runs_one_at_a_time_in_put_order": 7.7,
    "tests/test_submission_faults.py::test_a_long_map_routes_its_remaining_puts_elsewhere_while_a_queue_is_removed[imap]": 7.7,
    "tests/consumer/test_elastic.py::test_workers_that_join_after_the_pools_exist_get_consumers_": 7.5,
    "tests/test_membership.py::test_retiring_a_queues_worker_moves_the_queue_and_loses_nothing[transient]": 7.3,
    "tests/consumer/test_scheduling.py::test_fair_share_starts_a_late_small_type_before_the_": 7.2,
    "tests/test_client_restart.py::test_a_pool_that_never_got_a_call_lets_go_of_its_directory_": 7.1,
    "tests/consumer/test_faults.py::test_killed_consumer_leases_are_redelivered_and_it_is_replaced[transient]": 7.0,
    "tests/test_submission_faults.py::test_a_long_map_routes_its_remaining_puts_elsewhere_while_a_queue_is_removed[typed map]": 7.0,
    "tests/test_membership_thread.py::test_forgetting_closed_pools_returns_the_threads_and_": 7.0,
    "tests/queue/test_compaction_off_loop.py::test_calls_made_during_a_compaction_wait_for_": 7.0,
    "tests/consumer/test_resize.py::test_remove_queue_under_load_drains_it_into_the_others": 6.7,
    "tests/test_nested.py::test_the_documents_and_pages_example_reads_every_page_of_every_document": 6.6,
    "tests/consumer/test_pool.py::test_an_idle_consumer_asks_only_its_home_queue_and_still_": 6.6,
    "tests/consumer/test_pool.py::test_idle_consumers_long_poll_instead_of_spinning": 6.5,
    "tests/test_lane.py::test_many_threads_share_one_lane": 6.5,
    "tests/consumer/test_elastic.py::test_a_killed_consumers_leases_come_back_at_once_and_it_is_replaced[None]": 6.5,
    "tests/queue/test_deadlines.py::test_a_queue_whose_event_loop_is_blocked_costs_each_call_": 6.4,
    "tests/consumer/test_dead_letters.py::test_a_durable_pool_keeps_dead_letters_whole_across_": 6.3,
    "tests/test_shared_cluster_guard.py::test_the_guard_never_counts_workers_a_cache_refresh_": 6.2,
    "tests/test_s32_house_close_after_loss.py::test_a_consumer_pool_made_right_after_a_worker_": 6.1,
    "tests/test_attach_moved.py::test_a_producer_in_another_process_maps_exactly_while_the_owner_moves_its_messages[remove_": 6.1,
    "tests/queue/test_core_machine.py::TestQueueCoreMachine::runTest": 6.1,
    "tests/test_fixes4_leases.py::test_tasks_outliving_their_lease_on_a_queue_being_removed_": 6.0,
    "tests/test_attach.py::test_a_second_client_in_another_process_maps_while_the_owner_maps_": 5.9,
    "tests/queue/test_packed_pools.py::test_the_failed_half_of_packed_chunks_is_retried_and_every_result_comes_back[auto]": 5.9,
    "tests/consumer/test_time_limits.py::test_a_task_that_cannot_be_interrupted_does_not_hold_its_slot[thread-0]": 5.4,
    "tests/queue/test_keys.py::test_each_key_runs_one_at_a_time_and_completes_in_put_order": 5.3,
    "tests/test_nested.py::test_follow_ups_stream_through_as_completed_of_the_owner": 5.2,
    "tests/test_fixes4_interrupts.py::test_a_second_ctrl_c_outside_the_wait_for_an_answer_still_raises_with_the_stored_ids[as the ids are listed]": 5.2,
    "tests/consumer/test_resize_early_ack.py::test_remove_queue_keeps_the_outcomes_of_early_": 5.2,
    "tests/test_membership.py::test_a_backlog_scales_the_cluster_up_and_scale_down_hands_queues_": 5.1,
    "tests/queue/test_core_handoff.py::test_a_successor_core_goes_on_exactly_as_the_original": 5.1,
    "tests/test_joblib_backend.py::test_importing_daskqueue_does_not_import_joblib_and_the_": 5.0,
    "tests/test_nested.py::test_a_pool_passed_as_an_argument_pickles_and_submits_from_the_worker": 5.0,
    "tests/segment/test_store.py::test_reopening_a_million_ready_messages_is_fast": 4.8,
    "tests/queue/test_packed_pools.py::test_map_of_one_argument_calls_runs_packed_with_failures_": 4.8,
    "tests/consumer/test_time_limits.py::test_a_task_past_its_limit_is_interrupted_retried_then_dead_lettered[process]": 4.7,
    "tests/test_s32_house_stats_one_deadline.py::test_stats_of_unanswering_consumers_costs_": 4.7,
    "tests/queue/test_function_eviction.py::test_durable_reopen_before_compaction_reports_no_": 4.6,
    "tests/test_adapt_backlog.py::test_a_backlog_counts_at_the_first_settle_that_leaves_work": 4.6,
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
