"""Packed put groups end to end, on the shared cluster: retried parts of a packed chunk in a
consumer's child process and on its threads, a packed chunk moved by ``remove_queue``, raw
items for a custom consumer, and ``map``'s pipelined sending stopped by a bad argument."""

from __future__ import annotations

import os

import pytest

from daskqueue import ConsumerBase
from daskqueue.errors import SerializationError
from tests import tasks
from tests.helpers import wait_until


def fail_once(x, marker_dir):
    """Fail the first time for odd ``x`` (a marker file remembers), then return ``2 * x``."""
    marker = os.path.join(marker_dir, str(x))
    if x % 2 and not os.path.exists(marker):
        open(marker, "w").close()
        raise ValueError(f"first try of {x}")
    return 2 * x


class Echo(ConsumerBase):
    """Returns each raw item with its message's attempts."""

    def process_item(self, message):
        return (message.data, message.attempts)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("isolation", ["auto", "thread"])
def test_the_failed_half_of_packed_chunks_is_retried_and_every_result_comes_back(pools, tmp_path, isolation):
    qp = pools.queue(2, retry_backoff_base_s=0.01, retry_backoff_max_s=0.05)
    cp = pools.consumer(qp, n_consumers=2, isolation=isolation)
    cp.start()
    n = 3000
    ids = qp.batch_submit([(fail_once, i, str(tmp_path)) for i in range(n)])
    cp.join(timeout=90)
    results = cp.results()
    assert [results[i] for i in ids] == [2 * i for i in range(n)]
    assert sum(s.total_retried for s in qp.stats()) == n // 2


@pytest.mark.timeout(120)
def test_map_of_one_argument_calls_runs_packed_with_failures_in_their_places(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    out = qp.map(tasks.fail_if_odd, range(5000), errors="return")
    assert [v for v in out[::2]] == [tasks.fail_if_odd(i) for i in range(0, 5000, 2)]
    assert all(type(v).__name__ == "RemoteTaskError" for v in out[1::2])


@pytest.mark.timeout(120)
def test_packed_messages_waiting_on_a_removed_queue_move_and_run(pools):
    qp = pools.queue(3)
    ids = qp.batch_submit([(tasks.double, i) for i in range(3000)])
    assert qp.remove_queue(1, timeout_s=60) > 0
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    cp.join(timeout=90)
    results = cp.results()
    assert [results[i] for i in ids] == [2 * i for i in range(3000)]


@pytest.mark.timeout(120)
def test_raw_items_reach_a_custom_consumer_from_a_packed_group(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=1, ConsumerClass=Echo)
    cp.start()
    items = [{"item": i} for i in range(500)]
    ids = qp.put_many(items)
    cp.join(timeout=60)
    results = cp.results()
    assert [results[i] for i in ids] == [(item, 0) for item in items]


@pytest.mark.timeout(120)
def test_a_bad_argument_after_the_first_batch_stops_map_and_drops_the_outcomes_sent(pools):
    qp = pools.queue(2, put_batch_size=100)
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    items = list(range(1000))
    items[700] = tasks.Unpicklable()
    with pytest.raises(SerializationError, match="task 700") as info:
        qp.map(tasks.double, items)
    assert info.value.index == 700
    # The batches sent before it run; their outcomes never reach results().
    wait_until(lambda: sum(s.total_acked for s in qp.stats()) == 700, timeout_s=60)
    cp.join(timeout=60)
    assert cp.results() == {}
    assert qp.map(tasks.double, range(300)) == [2 * i for i in range(300)]
    # In the first batch: nothing is sent.
    items[700], items[5] = 700, tasks.Unpicklable()
    before = sum(s.total_put for s in qp.stats())
    with pytest.raises(SerializationError, match="task 5"):
        qp.map(tasks.double, items)
    assert sum(s.total_put for s in qp.stats()) == before
