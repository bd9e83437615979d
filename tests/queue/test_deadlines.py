"""Every client call has an overall deadline: a queue whose event loop is blocked (its worker
still counts as alive) costs the caller its timeout, not more."""

from __future__ import annotations

import os
import time

import pytest

from daskqueue import ConsumerPool, JoinTimeoutError, QueuePool, defaults
from daskqueue.errors import QueueCallTimeoutError
from tests import tasks
from tests.helpers import wait_until

BLOCK_S = 20.0  # the longest the loop is held; the test lets it go when done
#: What a caller may wait past its timeout: the grace a call gets, and a slice of slack.
SLACK_S = defaults.CALL_GRACE_S + 1.5


async def block_loop(seconds: float, marker: str, release: str) -> None:
    """Run on the worker's event loop (``client.run(..., wait=False)``): say so, then hold
    the loop (as a stuck fsync or a CPU-bound callback would) until ``release`` exists."""
    open(marker, "w").close()
    deadline = time.monotonic() + seconds
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)  # blocking on purpose: the loop must not run


def elapsed_s(since: float) -> float:
    return time.monotonic() - since


def test_a_queue_whose_event_loop_is_blocked_costs_each_call_its_timeout(cluster_factory, tmp_path):
    _, client = cluster_factory(2)
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp, n_consumers=1)  # not started: the work stays pending
    try:
        task_id = qp.submit(tasks.double, 1)
        marker, release = str(tmp_path / "blocked"), str(tmp_path / "release")
        client.run(block_loop, BLOCK_S, marker, release, workers=[qp.queues[0]._address], wait=False)
        wait_until(lambda: os.path.exists(marker), timeout_s=30)
        blocked_at = time.monotonic()

        started = time.monotonic()
        with pytest.raises(JoinTimeoutError):
            qp.result(task_id, timeout_s=1.0)
        assert elapsed_s(started) < 1.0 + SLACK_S

        started = time.monotonic()
        with pytest.raises(JoinTimeoutError):
            cp.join(timeout=1.0)
        assert elapsed_s(started) < 1.0 + SLACK_S

        started = time.monotonic()
        with pytest.raises(QueueCallTimeoutError) as info:
            qp.stats(timeout_s=1.0)
        assert elapsed_s(started) < 1.0 + SLACK_S and info.value.queue_index == 0
        assert elapsed_s(blocked_at) < BLOCK_S  # all of it while the loop was still blocked
        open(release, "w").close()
    finally:
        cp.close()
        qp.close()
