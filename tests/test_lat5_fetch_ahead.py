"""A consumer whose batch emptied its queue fetches ahead once that batch settled
(``daskqueue.consumer.running.DEFER_FETCH_AHEAD``): work that comes meanwhile still runs,
in order of its slot, and nothing waits longer than the batch ahead of it."""

from __future__ import annotations

import time

import pytest

from tests import tasks
from tests.helpers import wait_until


@pytest.mark.timeout(120)
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_work_put_while_the_only_slot_runs_is_run_right_after(pools, isolation):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation=isolation)
    cp.start()
    for i in range(3):  # warm: the child, the functions, the batch size
        assert cp.result(qp.submit(tasks.double, i), timeout=60) == 2 * i
    slow = qp.submit(tasks.sleep_then, 7, 1.0)
    wait_until(lambda: qp.stats()[0].leased == 1, timeout_s=30)  # running: its queue is empty
    fast = qp.submit(tasks.double, 21)
    t0 = time.monotonic()
    assert cp.result(fast, timeout=60) == 42
    waited = time.monotonic() - t0
    assert cp.result(slow, timeout=60) == 7
    assert waited < 10.0  # after the slow one (one slot), not after a poll interval or a lease's end
    for i in range(5):  # single tasks after it go on as before
        assert cp.result(qp.submit(tasks.double, i), timeout=60) == 2 * i


@pytest.mark.timeout(120)
def test_a_backlog_is_fetched_ahead_as_before(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1)
    cp.start()
    assert qp.map(tasks.double, range(2000)) == [2 * i for i in range(2000)]
