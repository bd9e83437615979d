"""One call's messages are spread evenly over the queues (issue 21, point 6): read off the
queues' own stats on a real cluster."""

from __future__ import annotations

import pytest

from tests import tasks


def put_per_queue(qp):
    return [q.stats().result(timeout=30).total_put for q in qp.queues]


@pytest.mark.timeout(120)
def test_map_spreads_its_items_evenly_over_two_queues(pools):
    # 60,000 items were 3 batches of 20,000 (the put_batch_size): 40,000 / 20,000.
    qp = pools.queue(2)
    pools.consumer(qp).start()
    assert qp.map(tasks.double, range(60_000), timeout_s=100) == [2 * x for x in range(60_000)]
    assert put_per_queue(qp) == [30_000, 30_000]


@pytest.mark.timeout(60)
def test_put_many_and_batch_submit_spread_each_call_within_one_message(pools):
    qp = pools.queue(3, put_batch_size=100)
    qp.put_many(range(1001))
    assert sorted(put_per_queue(qp)) == [333, 334, 334]
    qp.batch_submit([(tasks.add, i, 1) for i in range(700)])
    counts = put_per_queue(qp)
    assert sum(counts) == 1701 and max(counts) - min(counts) <= 2  # one message per call at most
