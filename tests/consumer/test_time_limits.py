"""Time limits: a task past its limit is interrupted and counts as a failed attempt; one that
cannot be interrupted (a C call) loses its slot and lease instead of holding them forever;
limits set per pool, per call and per message; threads and child processes."""

from __future__ import annotations

import time

import pytest

from daskqueue.errors import ConfigurationError, RemoteTaskError
from tests import tasks


@pytest.mark.timeout(120)
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_task_past_its_limit_is_interrupted_retried_then_dead_lettered(pools, isolation):
    qp = pools.queue(1, max_retries=1, retry_backoff_base_s=0.01)
    cp = pools.consumer(qp, n_consumers=1, isolation=isolation)
    cp.start()
    started = time.monotonic()
    slow = qp.submit(tasks.spin, 30, dq_time_limit_s=0.5)
    fast = qp.batch_submit([(tasks.spin, 0.01) for _ in range(5)], time_limit_s=5)
    with pytest.raises(RemoteTaskError) as info:
        qp.result(slow, timeout_s=60)
    assert time.monotonic() - started < 20  # two attempts of 0.5 s, not 30 s
    assert info.value.exc_type == "daskqueue.errors.TimeLimitExceeded" and info.value.attempts == 2
    assert [qp.result(i, timeout_s=30) for i in fast] == [0.01] * 5


@pytest.mark.timeout(120)
def test_the_pools_limit_applies_unless_a_call_sets_its_own(pools):
    qp = pools.queue(1, max_retries=0, time_limit_s=0.3)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    out = qp.map(tasks.spin, [0.01, 2.0], errors="return", timeout_s=60)
    assert out[0] == 0.01 and isinstance(out[1], RemoteTaskError)
    assert qp.map(tasks.spin, [1.0], time_limit_s=10, timeout_s=60) == [1.0]
    with pytest.raises(ConfigurationError, match="time_limit_s"):
        qp.submit(tasks.spin, 1, dq_time_limit_s=-1)


#: The grace the workers give a task past its limit in the test below, instead of the
#: library's ``TIME_LIMIT_GRACE_S`` (5 s): the test proves the slot is given up after the
#: grace, not the grace's length, and a process consumer waits it out twice (the stuck item
#: is run again alone to find which item hangs), 10 s of the suite's time.
GRACE_S = 1.0


def _set_grace(grace_s):
    """On a worker: every daskqueue module's ``TIME_LIMIT_GRACE_S`` (the consumer modules
    read ``defaults``' or import it by name) set to ``grace_s``; returns what they held."""
    import sys

    import daskqueue.consumer.isolate  # noqa: F401  (loaded, so that its name is set too)
    import daskqueue.consumer.running  # noqa: F401

    held = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("daskqueue") and isinstance(getattr(module, "TIME_LIMIT_GRACE_S", None), float):
            held[name] = module.TIME_LIMIT_GRACE_S
            module.TIME_LIMIT_GRACE_S = grace_s
    return held


def _restore_grace(held):
    import sys

    for name, value in held.items():
        sys.modules[name].TIME_LIMIT_GRACE_S = value


@pytest.fixture
def short_grace(client):
    """``GRACE_S`` on the shared cluster's workers for one test, the library's after it."""
    held = client.run(_set_grace, GRACE_S)
    try:
        assert all("daskqueue.defaults" in values for values in held.values()), held
        yield GRACE_S
    finally:
        for address, values in held.items():
            client.run(_restore_grace, values, workers=[address])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("isolation, prefetch_batches", [("thread", 0), ("process", 0), ("thread", 1)])
def test_a_task_that_cannot_be_interrupted_does_not_hold_its_slot(pools, isolation, prefetch_batches, short_grace):
    """A C call past its limit ignores the interruption: after the grace (``GRACE_S`` here)
    the consumer gives the slot up (threads: a fresh thread pool; process: the child is
    killed), and the next task runs; the stuck one fails as TimeLimitExceeded. With a
    prefetch, the next task waits for the stuck one's thread at the thread pool's gate,
    and is handed the slot when that thread is left behind."""
    qp = pools.queue(1, max_retries=0, lease_timeout_s=3)
    cp = pools.consumer(qp, n_consumers=1, max_concurrency=1, prefetch_batches=prefetch_batches, batch_size=1,
                        isolation=isolation)
    cp.start()
    stuck = qp.submit(tasks.block_in_c, 60, dq_time_limit_s=0.5)
    time.sleep(0.5)
    after = qp.submit(tasks.double, 21)
    started = time.monotonic()
    assert qp.result(after, timeout_s=60) == 42
    assert time.monotonic() - started < 30  # not the 60 s the stuck task would take
    with pytest.raises(RemoteTaskError) as info:
        qp.result(stuck, timeout_s=60)
    assert info.value.exc_type in ("daskqueue.errors.TimeLimitExceeded", "daskqueue.LeaseExpired")
