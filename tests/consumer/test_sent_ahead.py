"""A consumer that runs its batches in a child process sends the batch it fetched ahead to
the child at once, while the batch before it still runs there (so a run thread that frees
starts it with no round trip to the worker's event loop), and still gives it back unrun
when it stops first. Real cluster (the shared one)."""

from __future__ import annotations


import pytest

from tests.gate_tasks import lines, noted, run_until_released
from tests.helpers import wait_until


@pytest.mark.timeout(120)
def test_the_batch_fetched_ahead_reaches_the_child_while_the_one_before_runs(pools, tmp_path):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, batch_size=1, max_concurrency=1, prefetch_batches=1,
                        isolation="process")
    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    # Two functions: the child is sent each with the first batch that needs it.
    first = qp.submit(run_until_released, 0, started, release)
    second = qp.submit(noted, 1, started)
    cp.start()
    (consumer,) = cp.consumers
    try:
        wait_until(lambda: lines(started) == ["0"], timeout_s=60)
        # The second batch is in the child (its function with it) while the first still runs.
        wait_until(lambda: consumer.function_counts().result(timeout=30)["child"] == 2, timeout_s=15)
        assert lines(started) == ["0"]  # and it waits there for the only run thread
    finally:
        open(release, "w").close()
    assert qp.result(first, timeout_s=60) == 0 and qp.result(second, timeout_s=60) == 1
    assert lines(started) == ["0", "1"]
