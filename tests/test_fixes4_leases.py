"""Leases of tasks that run from a queue while the owner removes it: the queue keeps them
(leased messages never move), stays open until they are settled, and the consumers extend
them there meanwhile. A regression test of that path (it passes before this branch too: no
defect was found there, see the branch's report); on the shared cluster."""

from __future__ import annotations

import functools
import threading

import pytest

from tests import tasks
from tests.helpers import wait_until


@pytest.mark.timeout(120)
def test_tasks_outliving_their_lease_on_a_queue_being_removed_are_extended_there_and_run_once(pools):
    # Leases of 1 s, tasks of 1.5 s, no retries: a lease not extended at the queue being
    # removed would expire and dead-letter its task (a RemoteTaskError in the map).
    qp = pools.queue(3, max_retries=0, lease_timeout_s=1.0, put_batch_size=1)
    cp = pools.consumer(qp, n_consumers=2, max_concurrency=2)
    cp.start()
    removed = {}

    def remove():
        wait_until(lambda: [s for s in qp.stats() if s.index == 2][0].leased > 0, timeout_s=60, interval_s=0.005)
        removed["moved"] = qp.remove_queue(2, timeout_s=90)

    remover = threading.Thread(target=remove)
    remover.start()
    try:
        out = qp.map(functools.partial(tasks.sleep_then, seconds=1.5), range(9), timeout_s=90)
    finally:
        remover.join(timeout=100)
    assert out == list(range(9))
    assert "moved" in removed and qp.queue_indices == [0, 1]
    assert sum(s.total_expired for s in qp.stats()) == 0
