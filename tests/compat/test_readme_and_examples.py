"""Coming from daskqueue 0.2.0: the original README example and the call shapes of its
examples run against this package, on a real cluster, and each old spelling warns once
(DeprecationWarning) with the new one. Written from the original's documented API; none of
its code is used."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import warnings

import pytest

from tests import tasks


def deprecations(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DeprecationWarning)]


def square_sum():
    return sum(i * i for i in range(1000))


def test_the_old_logger_and_base_class_names_work_and_warn_once():
    import logging

    from daskqueue import compat

    compat.reset_warnings()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        from daskqueue.utils import logger
        from daskqueue.utils import logger as again
        from daskqueue import ConsumerBase, ConsumerBaseClass
    assert logger is again is logging.getLogger("daskqueue")
    assert issubclass(ConsumerBaseClass, ConsumerBase)  # its process_item gets the raw item
    messages = deprecations(record)
    assert len([m for m in messages if "daskqueue.utils.logger" in m]) == 1
    assert any('logging.getLogger("daskqueue")' in m for m in messages)
    assert len([m for m in messages if "ConsumerBaseClass" in m]) == 1
    assert record[0].filename == __file__  # pointed at the caller's line, not at daskqueue


@pytest.mark.timeout(120)
def test_the_original_readme_example_runs(client):
    """The README of daskqueue 0.2.0, but for ``from daskqueue.utils import logger`` (tested
    above) and with a smaller sum: submit, join, results."""
    from daskqueue import ConsumerPool, QueuePool

    queue_pool = QueuePool(client, n_queues=1)
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=2)
    try:
        consumer_pool.start()
        for _ in range(5):
            queue_pool.submit(square_sum)
        consumer_pool.join()
        results = consumer_pool.results()
        assert list(results.values()) == [square_sum()] * 5
        nested = consumer_pool.results(by_consumer=True)  # the original's shape
        assert set(nested) <= {"GeneralConsumer-0", "GeneralConsumer-1"}
        assert sorted(v for per in nested.values() for v in per.values()) == [square_sum()] * 5
    finally:
        consumer_pool.close()
        queue_pool.close()


@pytest.mark.timeout(120)
def test_the_original_examples_call_shapes_run_and_warn(client):
    """``examples/perf_cpu_bound.py`` of 0.2.0: max_concurrency=10000, start(timeout=),
    join(timestep=, print_timestep=, progress=), print() of both pools, nb_consumed, len."""
    from daskqueue import ConsumerPool, QueuePool, compat

    compat.reset_warnings()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        queue_pool = QueuePool(client, n_queues=2)
        consumer_pool = ConsumerPool(client, queue_pool, n_consumers=2, max_concurrency=10000)
        try:
            queue_pool.batch_submit([(tasks.add, 1, 2) for _ in range(200)])
            consumer_pool.start(timeout=1)
            consumer_pool.join(timestep=0.001, print_timestep=1, progress=True)
            assert "QueuePool" in str(queue_pool) and "ConsumerPool" in str(consumer_pool)
            assert consumer_pool.nb_consumed() == 200
            assert len(consumer_pool) == 2
            assert consumer_pool[0] is consumer_pool.consumers[0]
            # Made with 0.2.0 spellings: results() nests by consumer, as 0.2.0's did.
            res = consumer_pool.results()
            assert sorted(res) == ["GeneralConsumer-0", "GeneralConsumer-1"]
            assert [v for k in res for v in res[k].values()] == [3] * 200
            assert list(consumer_pool.results(by_consumer=False).values()) == [3] * 200
            # As the original meant it: a cap on tasks in flight, run on the worker's threads
            # (1 here), not 10,000 threads.
            assert consumer_pool.max_concurrency == 1
        finally:
            consumer_pool.close()
            queue_pool.close()
    messages = deprecations(record)
    for old in ("max_concurrency=10000", "start(timeout=", "join(timestep=", "nb_consumed()", "len(consumer_pool)",
                "consumer_pool[i]", "nested by consumer"):
        assert len([m for m in messages if old in m]) == 1, (old, messages)


@pytest.mark.timeout(120)
def test_an_original_custom_consumer_gets_the_raw_item(client):
    from daskqueue import ConsumerPool, QueuePool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from daskqueue import ConsumerBaseClass

    class DoubleConsumer(ConsumerBaseClass):
        def process_item(self, item):
            return item * 2  # 0.2.0 gave the item put_many put (issue 22, point 9)

    queue_pool = QueuePool(client, n_queues=1)
    consumer_pool = ConsumerPool(client, queue_pool, ConsumerClass=DoubleConsumer, n_consumers=1)
    try:
        ids = queue_pool.put_many(list(range(20)))
        consumer_pool.start()
        consumer_pool.join(timeout=60)
        results = consumer_pool.results(by_consumer=False)
        assert [results[i] for i in ids] == [2 * i for i in range(20)]
    finally:
        consumer_pool.close()
        queue_pool.close()


SCRIPT = textwrap.dedent("""
    import atexit
    if __name__ == "__main__":  # registered first, so it runs last: after daskqueue's exit hook
        atexit.register(lambda: print("CLOSED", queue_pool._closed, consumer_pool._closed, flush=True))
    from distributed import Client
    from daskqueue import QueuePool, ConsumerPool

    def process_item():
        return sum(i * i for i in range(10**5))

    if __name__ == "__main__":
        client = Client(n_workers=2, threads_per_worker=1, direct_to_workers=True, dashboard_address=None)
        queue_pool = QueuePool(client, n_queues=1)
        consumer_pool = ConsumerPool(client, queue_pool, n_consumers=2)
        consumer_pool.start()
        for i in range(5):
            queue_pool.submit(process_item)
        consumer_pool.join()
        print("RESULTS", len(consumer_pool.results()))
""")


def _without_dask_heartbeat_at_exit(stderr: str) -> str:
    """``stderr`` without the log records of a worker whose heartbeat found the scheduler
    gone: Dask's own race at exit (``Client.close(timeout=3)`` of the implicit cluster runs
    out on a loaded machine and the scheduler dies with the script, before the worker
    processes), which daskqueue's exit hook does not take part in. Every other line stays."""
    records = re.split(r"(?m)^(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - )", stderr)
    return "".join(r for r in records if "Failed to communicate with scheduler during heartbeat" not in r)


@pytest.mark.timeout(10)
def test_only_the_heartbeat_record_is_left_out_of_stderr():
    other = "2026-11-24 23:50:18,709 - daskqueue - ERROR - boom\nTraceback (most recent call last):\n"
    heartbeat = ("2026-11-24 23:50:18,707 - distributed.worker - ERROR - Failed to communicate with "
                 "scheduler during heartbeat.\nTraceback (most recent call last):\n  x\nCommClosedError\n")
    assert _without_dask_heartbeat_at_exit("warn\n" + heartbeat + other) == "warn\n" + other


@pytest.mark.timeout(300)
def test_a_script_that_never_closes_its_pools_exits_quietly_and_fast(tmp_path):
    path = tmp_path / "original_readme.py"
    path.write_text(SCRIPT)
    # The traceback showed in about 1 run of 3: three runs, side by side (each mostly waits
    # for its cluster to start and stop; one after another they took 19 s of the suite).
    runs = [subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path) for _ in range(3)]
    try:
        outputs = [(run.communicate(timeout=90), run.returncode) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    for (stdout, stderr), returncode in outputs:
        assert returncode == 0, stderr
        assert "RESULTS 5" in stdout and "CLOSED True True" in stdout
        assert "Traceback" not in _without_dask_heartbeat_at_exit(stderr), stderr
        assert "Error" not in _without_dask_heartbeat_at_exit(stderr), stderr
