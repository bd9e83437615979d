"""``QueuePool.executor()``: a real ``concurrent.futures.Executor`` on a real cluster."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from daskqueue import (ConsumerPool, DaskQueueError, NoConsumersError, QueueClosedError, QueueLostError, QueuePool,
                       RemoteTaskError, SerializationError)
from daskqueue.executor import QueueExecutor
from tests import executor_tasks as tasks
from tests.helpers import kill_worker, wait_until
from tests.tasks import Unpicklable


@pytest.fixture
def running(pools):
    """A queue pool of 2 queues (no retries: a failure is final at once) with its consumers
    started. (Starting consumers takes most of each test's time on a loaded machine, 6-14 s
    measured: the timeouts leave room for it; the calls themselves take 0.1-5 s.)

    The consumers run tasks on their own threads: where user code runs is no concern of the
    executor's, and a child process per consumer (the default, next to a queue) cost each
    test ~0.5 s of CPU. The tests of errors raised by tasks use ``running_in_children``."""
    qp = pools.queue(2, max_retries=0)
    pools.consumer(qp, isolation="thread").start()
    return qp


@pytest.fixture
def running_in_children(pools):
    """``running`` with the consumers' default isolation: tasks run in child processes."""
    qp = pools.queue(2, max_retries=0)
    pools.consumer(qp).start()
    return qp


def executor_threads(pool=None):
    """The executor threads alive (of ``pool`` only, if given: other tests' pools may have one)."""
    prefix = "daskqueue-executor" if pool is None else f"daskqueue-executor-{pool.name}"
    return [t for t in threading.enumerate() if t.name == prefix or (pool is None and t.name.startswith(prefix))]


class Escape(BaseException):
    """Not an Exception: concurrent.futures lets it out of a done-callback."""


def hold_thread(ex):
    """Block the executor's thread in a done-callback until the returned event is set, so
    that what is submitted meanwhile stays unsent."""
    release, held = threading.Event(), threading.Event()

    def block(_):
        held.set()
        release.wait(10)

    first = ex.submit(tasks.inc, 0)
    first.add_done_callback(block)
    assert held.wait(10)
    return first, release


@pytest.mark.timeout(60)
def test_submit_gives_a_real_future_with_the_result(running):
    with running.executor() as ex:
        assert isinstance(ex, cf.Executor) and isinstance(ex, QueueExecutor)
        future = ex.submit(tasks.add, 1, 2, z=3)
        assert isinstance(future, cf.Future)
        assert future.result(timeout=10) == 6
        assert future.done() and not future.cancelled() and future.exception() is None


@pytest.mark.timeout(60)
def test_a_task_error_is_raised_as_its_own_type_with_the_remote_traceback(running_in_children):
    with running_in_children.executor() as ex:
        future = ex.submit(tasks.boom, 5)
        with pytest.raises(ValueError, match="boom 5") as info:
            future.result(timeout=10)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTaskError) and cause.exc_type == "ValueError"
    # The worker's frames, in the chained error and on the rebuilt one.
    assert "executor_tasks.py" in cause.remote_traceback and "in boom" in cause.remote_traceback
    assert info.value.remote_traceback == cause.remote_traceback and info.value.task_id == cause.task_id
    assert isinstance(future.exception(), ValueError)


@pytest.mark.timeout(60)
def test_an_error_that_cannot_be_rebuilt_or_original_errors_off_raises_remote_task_error(running_in_children):
    with running_in_children.executor() as ex:
        with pytest.raises(RemoteTaskError, match="TwoPartError") as info:
            ex.submit(tasks.raise_two_part, 1).result(timeout=10)
        assert "raise_two_part" in info.value.remote_traceback
    with running_in_children.executor(original_errors=False) as ex:
        with pytest.raises(RemoteTaskError, match="boom 1"):
            ex.submit(tasks.boom, 1).result(timeout=10)


@pytest.mark.timeout(60)
def test_wait_and_as_completed_work_on_its_futures(running):
    with running.executor() as ex:
        slow = ex.submit(tasks.nap_then, "slow", 3.0)
        quick = [ex.submit(tasks.inc, i) for i in range(20)]
        done, not_done = cf.wait(quick + [slow], timeout=20, return_when=cf.FIRST_COMPLETED)
        assert done  # (which came first is the machine's business: no assertion on it)
        assert sorted(f.result() for f in cf.as_completed(quick, timeout=20)) == list(range(1, 21))
        assert [f.result() for f in cf.as_completed([slow], timeout=20)] == ["slow"]
        done, not_done = cf.wait(quick + [slow], timeout=20)
        assert not not_done


@pytest.mark.timeout(60)
def test_done_callbacks_run_once_each_also_when_added_after_the_end(running):
    seen = []
    with running.executor() as ex:
        futures = [ex.submit(tasks.inc, i) for i in range(10)]
        for f in futures:
            f.add_done_callback(lambda f: seen.append(f.result()))
        wait_until(lambda: len(seen) == 10, timeout_s=20)
        futures[0].add_done_callback(lambda f: seen.append("late"))  # runs at once, here
    assert sorted(seen[:10]) == list(range(1, 11)) and seen[10:] == ["late"]


@pytest.mark.timeout(60)
def test_map_is_ordered_and_pulls_its_input_lazily(running):
    pulled = []

    def items(n):
        for i in range(n):
            pulled.append(i)
            yield i

    with running.executor() as ex:
        results = ex.map(tasks.inc, items(200), buffersize=8)
        assert len(pulled) == 8  # the window is sent at once, no more
        first = [next(results) for _ in range(3)]
        assert first == [1, 2, 3]
        assert len(pulled) <= 8 + 3  # one more pulled per result taken
        assert list(results) == list(range(4, 201))
        assert len(pulled) == 200
        # Uneven durations still come back in input order; several iterables zip.
        assert list(ex.map(tasks.nap_then, [1, 2, 3], [0.6, 0.0, 0.3])) == [1, 2, 3]
        assert list(ex.map(tasks.inc, range(50), chunksize=7)) == list(range(1, 51))


@pytest.mark.timeout(60)
def test_map_raises_the_failed_items_error_in_its_place_and_times_out(running):
    with running.executor() as ex:
        results = ex.map(tasks.fail_on, range(6), [3] * 6)
        assert [next(results) for _ in range(3)] == [0, 1, 4]
        with pytest.raises(ValueError, match="bad item 3"):
            next(results)
        with pytest.raises(TimeoutError):
            list(ex.map(tasks.nap_then, [1], [2.0], timeout=0.3))


@pytest.mark.timeout(60)
def test_submissions_from_many_threads_are_sent_in_batches(running):
    with running.executor() as ex:
        out: list = []

        def submitter(k):
            out.extend(ex.submit(tasks.inc, k * 1000 + i) for i in range(200))

        first, release = hold_thread(ex)  # so that every submission waits for the same send
        threads = [threading.Thread(target=submitter, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        release.set()
        assert sorted(f.result(timeout=20) for f in out) == sorted(k * 1000 + i + 1 for k in range(8)
                                                                  for i in range(200))
        assert ex.batching == (2, 1601)  # the held first call, then the 1,600 in one send


@pytest.mark.timeout(60)
def test_an_unpicklable_call_fails_alone_its_batch_runs(running):
    with running.executor() as ex:
        first, release = hold_thread(ex)
        good = [ex.submit(tasks.inc, i) for i in range(3)]
        bad = ex.submit(tasks.inc, Unpicklable())
        release.set()
        with pytest.raises(SerializationError):
            bad.result(timeout=10)
        assert [f.result(timeout=10) for f in good] == [1, 2, 3]
        assert first.result() == 1


@pytest.mark.timeout(60)
def test_cancel_succeeds_before_sending_and_honestly_fails_after(running):
    with running.executor() as ex:
        first, release = hold_thread(ex)
        assert not first.cancel()  # sent (and done): too late
        unsent = ex.submit(tasks.inc, 1)
        assert unsent.cancel() and unsent.cancelled()
        release.set()
        sent = ex.submit(tasks.nap_then, "x", 1.0)
        wait_until(sent.running, timeout_s=10)
        assert not sent.cancel() and sent.result(timeout=10) == "x"
        done, _ = cf.wait([unsent], timeout=5)  # a cancelled future counts as done for wait()
        assert unsent in done


@pytest.mark.timeout(60)
def test_shutdown_waits_for_the_sent_calls_and_leaves_no_thread(running):
    ex = running.executor()
    futures = [ex.submit(tasks.nap_then, i, 0.2) for i in range(4)]
    ex.shutdown(wait=True)
    assert all(f.done() for f in futures) and [f.result() for f in futures] == [0, 1, 2, 3]
    assert not executor_threads(running)
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(tasks.inc, 1)
    ex.shutdown()  # again: nothing to do


@pytest.mark.timeout(60)
def test_shutdown_with_cancel_futures_cancels_only_the_unsent(running):
    ex = running.executor()
    first, release = hold_thread(ex)
    unsent = [ex.submit(tasks.inc, i) for i in range(5)]
    ex.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in unsent)
    release.set()
    ex.shutdown(wait=True)
    assert first.result() == 1 and not executor_threads(running)


@pytest.mark.timeout(60)
def test_closing_the_pool_fails_the_calls_in_flight_with_queue_closed(pools, monkeypatch):
    from daskqueue import executor_thread

    monkeypatch.setattr(executor_thread, "NO_CONSUMERS_GRACE_S", 60.0)  # the call stays in flight
    qp = pools.queue(1, max_retries=0)  # no consumers: nothing will run
    ex = qp.executor()
    future = ex.submit(tasks.inc, 1)
    wait_until(future.running, timeout_s=10)
    qp.close()
    with pytest.raises(QueueClosedError):
        future.result(timeout=10)
    ex.shutdown(wait=True)
    assert not executor_threads(qp)


@pytest.mark.timeout(60)
def test_outcomes_fetched_by_another_threads_poll_still_reach_their_futures(running):
    # Another poller (a second executor, a results() loop) may fetch an outcome between the
    # put's answer and the executor's claim on it: the future must still get it.
    stop = threading.Event()

    def poll_hard():
        while not stop.is_set():
            running.poll_outcomes()

    poller = threading.Thread(target=poll_hard)
    poller.start()
    try:
        with running.executor() as ex:
            got = [ex.submit(tasks.inc, i).result(timeout=10) for i in range(60)]
    finally:
        stop.set()
        poller.join()
    assert got == list(range(1, 61))
    assert running.results() == {}  # none left behind in the pool's results


@pytest.mark.timeout(60)
def test_an_executor_left_open_holds_no_thread_once_idle_or_forgotten(running, monkeypatch):
    from daskqueue import executor_thread

    monkeypatch.setattr(executor_thread, "IDLE_EXIT_S", 0.2)
    ex = running.executor()
    assert ex.submit(tasks.inc, 1).result(timeout=10) == 2
    wait_until(lambda: not executor_threads(running), timeout_s=10)  # idle: its thread ended
    assert ex.submit(tasks.inc, 2).result(timeout=10) == 3  # and a new one starts
    monkeypatch.setattr(executor_thread, "IDLE_EXIT_S", 60.0)
    assert ex.submit(tasks.inc, 3).result(timeout=10) == 4
    del ex  # forgotten, never shut down: its finalizer stops the thread
    import gc

    gc.collect()
    wait_until(lambda: not executor_threads(running), timeout_s=10)


@pytest.mark.timeout(60)
def test_the_pools_own_map_and_results_beside_an_executor_each_get_exactly_theirs(running):
    with running.executor() as ex:
        out = {}
        mapping = threading.Thread(target=lambda: out.update(ex=list(ex.map(tasks.inc, range(2000), buffersize=200))))
        mapping.start()
        try:
            assert running.map(tasks.inc, range(1000)) == list(range(1, 1001))
            ids = running.batch_submit([(tasks.inc, i) for i in range(300)])
            wait_until(lambda: all(i in running.results() for i in ids), timeout_s=30)
            results = running.results(clear=True)
        finally:
            mapping.join(30)
    assert out["ex"] == list(range(1, 2001))
    assert sorted(results) == sorted(ids) and [results[i] for i in ids] == list(range(1, 301))


@pytest.mark.timeout(90)
def test_a_failure_of_the_executors_thread_fails_its_futures_and_the_next_submit_starts_another(running):
    release, held = threading.Event(), threading.Event()

    def block_then_escape(_):
        held.set()
        release.wait(10)
        raise Escape("from a done-callback")

    with running.executor() as ex:
        first = ex.submit(tasks.inc, 0)
        first.add_done_callback(block_then_escape)
        assert held.wait(20)
        stranded = [ex.submit(tasks.inc, i) for i in range(5)]  # unsent: the thread is held
        release.set()
        for future in stranded:
            with pytest.raises(DaskQueueError, match="failed") as info:
                future.result(timeout=20)
            assert isinstance(info.value.__cause__, Escape)
        wait_until(lambda: not executor_threads(running), timeout_s=10)
        assert ex.submit(tasks.inc, 1).result(timeout=20) == 2  # a new thread
    assert not executor_threads(running)


@pytest.mark.timeout(90)
def test_the_pools_results_taken_in_a_loop_by_another_thread_never_take_the_executors(running):
    stop, taken = threading.Event(), {}

    def take_hard():
        while not stop.is_set():
            taken.update(running.results(clear=True))

    taker = threading.Thread(target=take_hard)
    taker.start()
    try:
        with running.executor() as ex:
            futures = [ex.submit(tasks.inc, i) for i in range(400)]
            futures += [ex.submit(tasks.inc, i) for i in range(400, 600)]
            got = [f.result(timeout=30) for f in futures]
    finally:
        stop.set()
        taker.join(30)
    assert got == list(range(1, 601)) and taken == {}


@pytest.mark.timeout(60)
def test_calls_in_flight_with_no_consumer_started_fail_with_no_consumers(pools):
    qp = pools.queue(1, max_retries=0)  # no consumer pool: nothing would ever run them
    ex = qp.executor()
    futures = [ex.submit(tasks.inc, i) for i in range(3)]
    for future in futures:
        with pytest.raises(NoConsumersError):
            future.result(timeout=20)
    ex.shutdown(wait=True)  # returns: nothing left in flight
    assert not executor_threads(qp)


@pytest.mark.timeout(90)
def test_shutdown_with_wait_returns_only_once_the_thread_ended(running):
    # The thread clears its own reference a moment before it ends: shutdown must join it
    # all the same, each time.
    for i in range(10):
        ex = running.executor()
        assert ex.submit(tasks.inc, i).result(timeout=20) == i + 1
        ex.shutdown(wait=True)
        assert not executor_threads(running), f"round {i}"


@pytest.mark.timeout(120)
def test_a_lost_transient_queue_fails_only_the_calls_it_held_the_others_complete(cluster_factory, tmp_path):
    _, client = cluster_factory(3)
    qp = QueuePool(client, 2, max_retries=2)  # the healthy queue's calls leased on the dead worker run again
    cp = ConsumerPool(client, qp, isolation="thread")
    gate = tmp_path / "gate"
    try:
        cp.start()
        victim = qp.queues[1]._address
        assert qp.queues[0]._address != victim
        with qp.executor() as ex:
            futures = [ex.submit(tasks.wait_for_gate, x, str(gate)) for x in range(40)]
            wait_until(lambda: all(f.running() for f in futures), timeout_s=20)
            kill_worker(client, victim)
            # The executor hears of the loss (the lost queue's calls fail) before any
            # call can end: the healthy queue's calls are still in flight then.
            wait_until(lambda: any(f.done() for f in futures), timeout_s=60)
            gate.touch()
            done, _ = cf.wait(futures, timeout=60)
            assert len(done) == len(futures)
        # The consumer pool follows the loss too (it tells its other consumers, whose polls of
        # the lost queue end then) before it is closed: closing first drops that change, and
        # close waited out those polls' 20 s deadline (half of the runs took 25 s).
        wait_until(lambda: victim not in {h._address for h in cp.consumers}, timeout_s=30)
        lost = [f.exception() for f in futures if f.exception() is not None]
        assert all(isinstance(e, QueueLostError) and e.queue_index == 1 for e in lost), lost
        ok = [f.result() for f in futures if f.exception() is None]
        assert lost and ok  # only the lost queue's calls failed
        assert set(ok) < set(range(40))
    finally:
        cp.close()
        qp.close()
