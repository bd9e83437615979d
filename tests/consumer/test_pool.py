"""ConsumerPool + QueuePool end to end on a real LocalCluster (2 worker processes)."""

from __future__ import annotations

import functools

import time
from collections import Counter

import pytest

from daskqueue import ConsumerBase, JoinTimeoutError, RemoteTaskError, make_id, split_id
from tests import tasks
from tests.helpers import wait_until


def test_100k_tasks_through_two_queues_and_two_consumers_each_result_once(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    ids = qp.batch_submit([(tasks.double, i) for i in range(100_000)])
    cp.join(timeout=120)
    results = cp.results()
    assert len(ids) == len(set(ids)) == 100_000
    assert len(results) == 100_000
    assert all(results[task_id] == 2 * i for i, task_id in enumerate(ids))
    assert {split_id(i)[0] for i in ids} == {0, 1}  # both queues were used
    assert cp.failures() == {}


def test_submit_passes_args_and_kwargs(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp)
    cp.start()
    a = qp.submit(tasks.add, 1, 2, z=3)
    b = qp.submit(tasks.add, 10)
    cp.join(timeout=30)
    assert cp.results() == {a: 6, b: 10}


def test_map_returns_results_in_input_order_with_progress_bar(pools, capsys):
    qp = pools.queue(2)
    cp = pools.consumer(qp)
    cp.start()
    assert qp.map(tasks.double, range(5000), progress=True) == [2 * i for i in range(5000)]
    assert "5000/5000" in capsys.readouterr().err
    assert cp.results() == {}  # map keeps its own results


def test_lambdas_and_closures_are_shipped_by_value(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp)
    cp.start()
    offset = 7
    assert qp.map(lambda x: x + offset, range(10)) == [x + 7 for x in range(10)]

    def local(x):
        return x * offset

    assert qp.map(local, [1, 2]) == [7, 14]


def test_failing_task_is_retried_then_dead_lettered_with_remote_traceback(pools):
    qp = pools.queue(2, max_retries=2, retry_backoff_base_s=0.01)
    cp = pools.consumer(qp)
    cp.start()
    bad = qp.submit(tasks.boom, 3)
    good = qp.batch_submit([(tasks.double, i) for i in range(100)])
    cp.join(timeout=30)
    failures = cp.failures()
    assert set(failures) == {bad}
    err = failures[bad]
    assert isinstance(err, RemoteTaskError)
    assert err.exc_type == "ValueError" and err.exc_message == "boom 3"
    assert "tasks.py" in err.remote_traceback and "raise ValueError" in err.remote_traceback
    assert err.attempts == 3  # the first run and two retries
    assert sum(s.total_retried for s in qp.stats()) == 2
    results = cp.results()
    assert bad not in results and all(results[g] == 2 * i for i, g in enumerate(good))


def test_map_raises_first_failure_or_returns_errors_in_place(pools):
    qp = pools.queue(2, max_retries=0)
    cp = pools.consumer(qp)
    cp.start()
    with pytest.raises(RemoteTaskError, match="odd 1"):
        qp.map(tasks.fail_if_odd, range(6))
    out = qp.map(tasks.fail_if_odd, range(6), errors="return")
    assert out[0::2] == [0, 2, 4]
    assert all(isinstance(e, RemoteTaskError) for e in out[1::2])


def test_one_consumer_drains_three_queues(pools):
    qp = pools.queue(3)
    cp = pools.consumer(qp, n_consumers=1)
    cp.start()
    ids = qp.batch_submit([(tasks.double, i) for i in range(3000)])
    # A call's messages are spread evenly over the queues, so every queue has work to drain.
    assert Counter(split_id(i)[0] for i in ids) == {0: 1000, 1: 1000, 2: 1000}
    assert {split_id(i)[0] for i in qp.batch_submit([(tasks.double, 0)] * 3)} == {0, 1, 2}
    cp.join(timeout=60)
    assert len(cp.results()) == 3003
    stats = qp.stats()
    assert [s.total_acked for s in stats] == [1001, 1001, 1001]
    assert all(s.pending == 0 for s in stats)


def test_idle_consumers_long_poll_instead_of_spinning(pools):
    qp = pools.queue(2)
    # Long polls of 6 s: a consumer that slept between polls instead of waiting in one would
    # take seconds to see new work; one woken by the put takes milliseconds (3 s: room for load).
    cp = pools.consumer(qp, n_consumers=2, idle_poll_s=6.0)
    cp.start()
    wait_until(lambda: all(s.fetch_calls > 0 for s in cp.stats()))  # started: idle from now on
    before = sum(s.get_calls for s in qp.stats())
    time.sleep(4.0)  # the idle period whose calls are counted: the behaviour under test
    calls = sum(s.get_calls for s in qp.stats()) - before
    per_consumer_per_s = calls / 2 / 4.0
    # One long poll of the home queue plus one look at the other queue per idle second.
    assert per_consumer_per_s <= 3.0, per_consumer_per_s
    # ...and an idle consumer still picks up new work at once.
    started = time.monotonic()
    assert qp.map(tasks.double, [21]) == [42]
    assert time.monotonic() - started < 3.0


def test_max_concurrency_bounds_running_and_fetched_work(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, max_concurrency=2, batch_size=1, prefetch_batches=1)
    cp.start()
    ids = qp.batch_submit([(tasks.concurrency_probe, 0.05) for _ in range(40)])
    most_leased = 0

    def drained_noting_most_leased():
        nonlocal most_leased
        stats = qp.stats()[0]
        most_leased = max(most_leased, stats.leased)
        return stats.pending == 0

    wait_until(drained_noting_most_leased, timeout_s=30)
    cp.join(timeout=30)
    seen = cp.results()
    assert max(seen[i] for i in ids) == 2  # two ran at once, never three
    assert most_leased <= 3  # two running + one prefetched batch of one


def test_cancel_mid_run_then_start_again_loses_nothing_and_runs_nothing_twice(pools, tmp_path):
    log = tmp_path / "runs.log"
    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=2, max_concurrency=2)
    cp.start()
    ids = qp.batch_submit([(tasks.logged_sleep, i, 0.002, str(log)) for i in range(1500)])
    wait_until(lambda: sum(s.total_acked for s in qp.stats()) > 0)
    cp.cancel()
    done_at_cancel = sum(s.total_acked for s in qp.stats())
    assert 0 < done_at_cancel < 1500
    assert sum(s.leased for s in qp.stats()) == 0  # every fetched batch was settled
    assert sum(s.inflight_items for s in cp.stats()) == 0
    cp.start()
    cp.join(timeout=60)
    results = cp.results()
    assert sorted(results[i] for i in ids) == list(range(1500))
    runs = Counter(int(line.split()[0]) for line in log.read_text().splitlines())
    assert set(runs) == set(range(1500))
    assert max(runs.values()) == 1


def test_early_ack_settles_before_running_and_still_reports_results(pools):
    qp = pools.queue(2, max_retries=3)
    cp = pools.consumer(qp, early_ack=True)
    cp.start()
    ids = qp.batch_submit([(tasks.fail_if_odd, i) for i in range(200)])
    cp.join(timeout=30)
    results, failures = cp.results(), cp.failures()
    assert {results[i] for i in ids[0::2]} == set(range(0, 200, 2))
    assert set(failures) == set(ids[1::2])
    assert all(f.attempts == 1 for f in failures.values())  # early ack: no retries
    assert sum(s.total_retried for s in qp.stats()) == 0


def test_join_timeout_reports_counts(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, batch_size=1)
    cp.start()
    qp.batch_submit([(tasks.sleep_then, i, 2.0) for i in range(10)])
    with pytest.raises(JoinTimeoutError) as info:
        cp.join(timeout=0.3)
    counts = info.value.counts
    assert counts["ready"] >= 8 and counts["ready"] + counts["leased"] == 10
    assert f"ready={counts['ready']}" in str(info.value)
    cp.cancel()


class Upper(ConsumerBase):
    def process_item(self, message):
        if message.data == "bad":
            raise KeyError("no upper for bad")
        return message.data.upper()


def test_custom_consumer_processes_raw_items_and_its_errors_are_failures(pools):
    qp = pools.queue(2, max_retries=1, retry_backoff_base_s=0.01)
    cp = pools.consumer(qp, ConsumerClass=Upper, n_consumers=2)
    cp.start()
    ids = qp.put_many(["a", "b", "bad", "c"], type="letters")
    one = qp.put("z", priority=5)
    cp.join(timeout=30)
    results, failures = cp.results(), cp.failures()
    assert [results.get(i) for i in ids] == ["A", "B", None, "C"] and results[one] == "Z"
    assert set(failures) == {ids[2]}
    assert failures[ids[2]].exc_type == "KeyError" and failures[ids[2]].attempts == 2
    assert all(s.running for s in cp.stats())  # the error did not stop the consumer


class OwnId(ConsumerBase):
    def process_item(self, message):
        return message.id


@pytest.mark.timeout(60)
def test_a_custom_consumer_sees_each_message_under_the_id_its_put_returned(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, ConsumerClass=OwnId, n_consumers=2, isolation="thread")
    cp.start()
    ids = qp.put_many([f"item {i}" for i in range(40)]) + [qp.put("one more")]
    cp.join(timeout=30)
    results = cp.results()
    assert {split_id(i)[0] for i in ids} == {0, 1}
    assert [results[i] for i in ids] == ids


def test_general_consumer_dead_letters_raw_items_at_once(pools):
    qp = pools.queue(1, max_retries=5)
    cp = pools.consumer(qp)
    cp.start()
    (item,) = qp.put_many([{"not": "a task"}])
    cp.join(timeout=30)
    err = cp.failures()[item]
    assert err.exc_type == "daskqueue.errors.InvalidTaskError" and err.attempts == 1


def test_ids_name_their_queue_and_sequence():
    assert split_id(make_id(3, 12345)) == (3, 12345)


def test_result_waits_for_one_task_and_raises_its_failure(pools):
    qp = pools.queue(2, max_retries=0)
    cp = pools.consumer(qp)
    cp.start()
    assert cp.result(qp.submit(tasks.sleep_then, "slow", 0.3), timeout=30) == "slow"
    with pytest.raises(RemoteTaskError, match="boom 5"):
        cp.result(qp.submit(tasks.boom, 5), timeout=30)
    cp.cancel()
    with pytest.raises(JoinTimeoutError):
        cp.result(qp.submit(tasks.double, 1), timeout=0.5)


def test_map_times_out_with_counts_when_tasks_outlast_it(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, batch_size=1)
    cp.start()
    with pytest.raises(JoinTimeoutError, match="pending=3"):
        qp.map(functools.partial(tasks.sleep_then, seconds=2.0), [1, 2, 3], timeout_s=0.5)
    cp.cancel()


def test_cancel_with_early_ack_loses_no_fetched_task(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, early_ack=True, batch_size=50)
    ids = qp.batch_submit([(tasks.sleep_then, i, 0.01) for i in range(300)])
    cp.start()
    wait_until(lambda: cp.stats()[0].inflight_items > 0)
    cp.cancel()  # batches are acked already: they must run to their end, not stop midway
    cp.start()
    cp.join(timeout=60)
    results = cp.results()
    assert [results.get(i) for i in ids] == list(range(300))


def test_a_failing_setup_fails_the_items_with_its_error_at_once(pools):
    qp = pools.queue(1, lease_timeout_s=60, max_retries=0)
    ids = qp.put_many(range(3))
    cp = pools.consumer(qp, ConsumerClass=tasks.FailingSetup, n_consumers=1)
    cp.start()
    t0 = time.monotonic()
    cp.join(timeout=30)
    assert time.monotonic() - t0 < 10  # not after the 60 s lease
    failures = cp.failures()
    assert sorted(failures) == sorted(ids)
    assert all("cannot open the database" in str(f) for f in failures.values())


def test_setup_runs_once_per_consumer_even_with_several_threads(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, ConsumerClass=tasks.CountingSetup, n_consumers=1, max_concurrency=4, batch_size=5)
    ids = qp.put_many(range(200))
    cp.start()
    cp.join(timeout=60)
    results = cp.results()
    assert {results[i] for i in ids} == {1}


def test_map_times_out_even_while_results_keep_arriving(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, batch_size=1)
    cp.start()
    t0 = time.monotonic()
    with pytest.raises(JoinTimeoutError) as info:
        qp.map(tasks.sleep_then, [0.01] * 1000, timeout_s=0.5)  # ~5 s of work
    assert time.monotonic() - t0 < 3
    assert info.value.counts["pending"] > 0
    cp.cancel()


def test_a_consumer_whose_home_queue_is_gone_still_drains_the_others(pools):
    qp = pools.queue(2)
    qp.batch_submit([(tasks.sleep_then, i, 0.002) for i in range(2000)])
    qp.queues[1].close().result()  # consumer 1's home queue
    cp = pools.consumer(qp, n_consumers=2, batch_size=10)
    cp.start()
    wait_until(lambda: qp.queues[0].stats().result().pending == 0, timeout_s=60, interval_s=0.1)
    stats = cp.stats()
    assert stats[1].items_done > 0  # it stole from queue 0 instead of failing on its home
    cp.cancel()


def test_an_idle_consumer_asks_only_its_home_queue_and_still_hears_of_work_elsewhere(pools):
    qp = pools.queue(4)
    cp = pools.consumer(qp, n_consumers=1, idle_poll_s=0.5)
    cp.start()
    qp.map(tasks.double, range(8))
    time.sleep(1.0)  # idle now: the long polls of the home queue time out every 0.5 s
    calls = [s.get_calls for s in qp.stats()]
    time.sleep(2.0)
    idle_calls = [b - a for a, b in zip(calls, (s.get_calls for s in qp.stats()))]
    assert sum(idle_calls) <= 6, idle_calls  # ~4 long polls of home; none to the 3 others
    cp.close()
    # Work put into any queue still starts at once: its queue tells the home queue, which
    # ends the waiting long poll. With 10 s long polls, so that a consumer which found the
    # work only as its poll timed out would take seconds (against 0.5 s polls, a 0.4 s bound
    # failed on a loaded machine).
    cp = pools.consumer(qp, n_consumers=1, idle_poll_s=10.0)
    cp.start()
    wait_until(lambda: cp.stats()[0].fetch_calls > 0)
    for i in range(8):  # two per queue
        started = time.monotonic()
        assert cp.result(qp.submit(tasks.double, i), timeout=30) == 2 * i
        assert time.monotonic() - started < 3.0


def test_map_raises_no_consumers_when_the_consumers_stop_while_it_waits(pools):
    import threading

    from daskqueue import NoConsumersError

    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, batch_size=1)
    cp.start()
    outcome: dict[str, object] = {}

    def run_map():
        try:
            outcome["values"] = qp.map(functools.partial(tasks.sleep_then, seconds=0.2), range(50), timeout_s=25)
        except Exception as e:
            outcome["error"] = e

    mapper = threading.Thread(target=run_map)
    mapper.start()
    wait_until(lambda: sum(s.items_done for s in cp.stats()) >= 1, timeout_s=30)
    cp.cancel()  # from another thread than map's, as a user's stop button would
    mapper.join(timeout=60)
    assert not mapper.is_alive()
    assert isinstance(outcome.get("error"), NoConsumersError), outcome
