"""A stopping consumer (its worker retires, its pool is cancelled or closed) gives back the
batches it fetched ahead at once, unrun, rather than once the items running ahead of them end:
their messages can run elsewhere meanwhile, and a consumer on a retiring worker leaves sooner
(one that does not settle within ``RETIRE_STOP_TIMEOUT_S`` is let go, and what it ran but had
not settled is run again). Real cluster (the shared one)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.helpers import wait_until


def run_until_released(x: int, started: str, release: str) -> int:
    """Note that task ``x`` started (a line in ``started``); wait until ``release`` exists."""
    fd = os.open(started, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{x}\n".encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    return x


def _started(path: str) -> list[int]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f.read().split()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_stopping_consumer_gives_back_its_batch_fetched_ahead_while_its_item_still_runs(pools, tmp_path, isolation):
    # "process": the batch fetched ahead waits in the child process, which sends it back.
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, batch_size=1, max_concurrency=1, prefetch_batches=1,
                        isolation=isolation)
    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    ids = qp.batch_submit([(run_until_released, i, started, release) for i in range(3)])
    cp.start()
    # One item runs (and waits for the release), one batch is fetched ahead of a free thread.
    wait_until(lambda: len(_started(started)) == 1 and qp.stats()[0].leased == 2, timeout_s=60)

    stopping = threading.Thread(target=cp.cancel, daemon=True)  # returns once the item ran
    stopping.start()
    try:
        # The batch fetched ahead is back in the queue while the running item still runs.
        wait_until(lambda: qp.stats()[0].leased == 1 and qp.stats()[0].ready == 2, timeout_s=15)
        assert not os.path.exists(release) and len(_started(started)) == 1
    finally:
        open(release, "w").close()
        stopping.join(timeout=60)
    assert not stopping.is_alive()

    cp.start()
    cp.join(timeout=60)
    results = cp.results()
    assert [results[i] for i in ids] == [0, 1, 2]
    assert sorted(_started(started)) == [0, 1, 2]  # each ran once: the given back one was not run
    stats = qp.stats()[0]
    assert stats.total_retried == 0
