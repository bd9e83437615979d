"""Scheduling by type on a real cluster: pool-wide caps across queues and consumers, and a
late small type that is not stuck behind a large backlog."""

from __future__ import annotations

import pytest

from daskqueue.errors import ConfigurationError
from tests import gate_tasks, tasks
from tests.helpers import wait_until


def max_overlap(intervals):
    """The most intervals ``(start, end)`` open at one instant."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def test_a_type_cap_holds_pool_wide_across_queues_and_consumers(pools):
    qp = pools.queue(2, scheduler="capped", type_caps={"bulk": 2})
    cp = pools.consumer(qp, n_consumers=4, max_concurrency=2, batch_size=1)
    cp.start()
    bulk = qp.batch_submit([(tasks.timed_sleep, i, 0.05) for i in range(40)], type="bulk")
    other = qp.batch_submit([(tasks.timed_sleep, i, 0.05) for i in range(40)], type="other")
    cp.join(timeout=120)
    results = cp.results()
    assert sorted(results[i][0] for i in bulk) == list(range(40))
    assert max_overlap([results[i][1:] for i in bulk]) <= 2
    # The other type is not capped: it used more of the 8 slots at once.
    assert max_overlap([results[i][1:] for i in other]) > 2


def test_fair_share_starts_a_late_small_type_before_the_backlog_is_done(pools):
    qp = pools.queue(2, scheduler="fair")
    cp = pools.consumer(qp, n_consumers=2, batch_size=1)
    cp.start()
    bulk = qp.batch_submit([(tasks.timed_sleep, i, 0.02) for i in range(300)], type="bulk")
    late = qp.batch_submit([(tasks.timed_sleep, i, 0.0) for i in range(10)], type="interactive")
    cp.join(timeout=120)
    results = cp.results()
    last_late = max(results[i][2] for i in late)
    bulk_ends = sorted(results[i][2] for i in bulk)
    # Under FIFO the late tasks would wait for all 300 (3 s of work); here they finish
    # while most of the backlog still waits.
    assert last_late < bulk_ends[len(bulk_ends) // 2]


def test_scheduler_settings_are_validated(client):
    from daskqueue import QueuePool

    with pytest.raises(ConfigurationError, match="scheduler"):
        QueuePool(client, 1, scheduler="lifo")
    with pytest.raises(ConfigurationError, match="capped"):
        QueuePool(client, 1, type_caps={"bulk": 1})
    with pytest.raises(ConfigurationError, match="type_caps"):
        QueuePool(client, 1, scheduler="capped", type_caps={"bulk": 0})
    with pytest.raises(ConfigurationError, match="max_type_share"):
        QueuePool(client, 1, scheduler="fair", max_type_share=1.5)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_reserved_slot_starts_an_urgent_task_while_every_other_slot_is_busy(pools, isolation, tmp_path):
    import time

    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, batch_size=1, reserved_slots=1, isolation=isolation)
    cp.start()
    # Long tasks: each runs until the test releases them (at most 60 s).
    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    long_ids = qp.batch_submit([(gate_tasks.run_until_released, i, started, release) for i in range(3)])
    # The only ordinary slot runs a long task.
    wait_until(lambda: gate_tasks.lines(started) and cp.stats()[0].busy_slots >= 1, timeout_s=30)
    submitted = time.time()
    urgent = qp.submit(tasks.timed_sleep, "urgent", 0.0, dq_priority=1)
    # It runs while the ordinary slot still holds a long task that cannot end yet: it is
    # not behind the long tasks. (Seconds, not a fraction: a loaded machine is slow to
    # deliver, but no wait of the consumer's is that long: its idle poll is 1 s.)
    _, urgent_started, _ = cp.result(urgent, timeout=30)
    assert urgent_started - submitted < 5.0
    assert gate_tasks.lines(started) == ["0"]
    with open(release, "w"):
        pass
    cp.join(timeout=60)
    assert sorted(cp.results()[i] for i in long_ids) == [0, 1, 2]


def test_messages_of_one_key_run_one_at_a_time_in_order_while_keys_run_in_parallel(pools):
    from daskqueue.messages import split_id

    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=4, max_concurrency=2)
    cp.start()
    keys = [f"device-{i % 12}" for i in range(240)]
    ids = qp.batch_submit([(tasks.timed_sleep, (k, i), 0.005) for i, k in enumerate(keys)], keys=keys)
    cp.join(timeout=120)
    results = cp.results()
    by_key: dict[str, list] = {}
    for task_id, k in zip(ids, keys):
        (_, i), start, end = results[task_id]
        by_key.setdefault(k, []).append((i, start, end, split_id(task_id)[0]))
    all_spans = []
    for k, runs in by_key.items():
        assert len({q for *_, q in runs}) == 1, f"key {k} went to two queues"
        runs.sort()  # by input position
        for (_, _, end, _), (_, start, _, _) in zip(runs, runs[1:]):
            assert start >= end, f"key {k}: a message started before the previous one ended"
        all_spans += [(s, e) for _, s, e, _ in runs]
    assert max_overlap(all_spans) > 1  # different keys did run at once
    assert len({split_id(i)[0] for i in ids}) == 2  # the keys spread over both queues


def test_map_with_a_key_returns_results_in_input_order(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp)
    cp.start()
    out = qp.map(tasks.double, range(300), key=lambda x: f"k{x % 7}", timeout_s=60)
    assert out == [2 * x for x in range(300)]


def test_keys_must_be_one_str_per_message(pools):
    qp = pools.queue(2)
    with pytest.raises(ConfigurationError, match="keys has 1 keys for 2"):
        qp.put_many([1, 2], keys=["a"])
    with pytest.raises(ConfigurationError, match="key 1 must be a str"):
        qp.put_many([1, 2], keys=["a", 3])


def test_a_consumer_takes_more_urgent_work_from_another_queue_before_its_home_queues(pools):
    import time

    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=1, batch_size=1, prefetch_batches=0)
    cp.start()
    low = qp.batch_submit([(tasks.timed_sleep, i, 0.02) for i in range(60)])  # 30 per queue
    # The consumer is running low tasks while both queues still hold many of them.
    wait_until(lambda: cp.stats()[0].busy_slots >= 1 and all(s.ready >= 10 for s in qp.stats()), timeout_s=30)
    submitted = time.time()
    urgent = [qp.submit(tasks.timed_sleep, f"u{i}", 0.0, dq_priority=5) for i in range(4)]  # 2 per queue
    cp.join(timeout=60)
    results = cp.results()
    urgent_starts = [results[i][1] for i in urgent]
    low_after = sorted(results[i][1] for i in low if results[i][1] > submitted)
    # Every urgent task started before the low tasks still waiting, on both queues; with
    # home-queue-first it would wait for its home's 30 x 20 ms.
    assert max(urgent_starts) < low_after[4], (urgent_starts, low_after[:6])


def test_a_keys_next_message_starts_as_soon_as_the_previous_is_settled(pools):
    import time

    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, idle_poll_s=2.0)
    cp.start()
    started = time.monotonic()
    ids = qp.batch_submit([(tasks.double, i) for i in range(20)], keys=["one"] * 20)
    cp.join(timeout=60)
    # 20 serial messages: a settle that frees the key wakes the waiting fetch at once,
    # rather than after the 2 s long poll (40 s in all).
    assert time.monotonic() - started < 10
    assert [cp.results()[i] for i in ids] == [2 * i for i in range(20)]


def test_a_key_with_more_messages_than_one_put_keeps_its_order(pools):
    qp = pools.queue(1, put_batch_size=50)
    cp = pools.consumer(qp, n_consumers=1)
    cp.start()
    ids = qp.batch_submit([(tasks.double, i) for i in range(300)], keys=["k"] * 300)  # 6 puts
    assert ids == sorted(ids)  # later messages of the key got later sequence numbers
    cp.join(timeout=60)
    assert [cp.results()[i] for i in ids] == [2 * i for i in range(300)]


@pytest.mark.timeout(120)
def test_a_child_with_reserved_slots_runs_its_tasks_at_a_lower_cpu_priority(pools):
    import os

    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, reserved_slots=1, isolation="process")
    cp.start()
    assert qp.map(tasks.niceness, [0], timeout_s=60) == [min(19, os.nice(0) + 5)]
