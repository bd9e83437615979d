"""A queue removed while early-acked tasks of its still run: their outcomes are not lost."""

from __future__ import annotations

import pytest

from daskqueue.messages import split_id
from tests import tasks
from tests.helpers import wait_until


@pytest.mark.timeout(120)
def test_remove_queue_keeps_the_outcomes_of_early_acked_tasks_still_running(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=2, max_concurrency=2, early_ack=True, batch_size=2)
    cp.start()
    ids = qp.batch_submit([(tasks.sleep_then, i, 1.5) for i in range(4)])
    on_1 = [i for i in ids if split_id(i)[0] == 1]
    assert on_1
    # Early acked: queue 1 holds nothing pending while its tasks still run.
    wait_until(lambda: [s for s in qp.stats() if s.index == 1][0].pending == 0, timeout_s=30)
    qp.remove_queue(1, timeout_s=60)
    cp.join(timeout=30)
    results = cp.results()
    assert sorted(results[i] for i in ids) == [0, 1, 2, 3]
