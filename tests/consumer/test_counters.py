"""A consumer's counters: the task-duration histogram (pure, no clock, no cluster)."""

from __future__ import annotations

import pytest

from daskqueue.consumer.counters import DURATION_BUCKETS_S, Counters

pytestmark = pytest.mark.timeout(10)


def test_the_duration_histogram_is_cumulative_per_bound():
    c = Counters()
    c.observe(4, 0.002)  # 0.5 ms each: at most every bound
    c.observe(1, 0.005)  # exactly on the 5 ms bound: counted there
    c.observe(2, 1.0)  # 0.5 s each
    c.observe(1, 1000.0)  # past every bound: only in the count (the +Inf bucket)
    c.observe(0, 3.0)  # nothing ran: nothing counted
    expected = [sum(n for n, per in [(4, 0.0005), (1, 0.005), (2, 0.5), (1, 1000.0)] if per <= bound)
                for bound in DURATION_BUCKETS_S]
    assert c.duration_buckets == expected
    assert expected[:3] == [4, 5, 5] and expected[-1] == 7
    assert c.duration_count == 8 and c.duration_sum_s == pytest.approx(1001.007)
    stats = c.snapshot(0, running=True, inflight_items=0, batch_size=1)
    assert stats.duration_buckets == tuple(expected) and stats.duration_count == 8
