"""``ConsumerPool.stats()`` waits for its consumers together, within one deadline: consumers
that do not answer (their workers' event loops blocked) cost it ``CONTROL_CALL_TIMEOUT_S``
once, not once each."""

from __future__ import annotations

import os
import time

import pytest

from daskqueue import ConsumerPool, QueuePool, defaults
from tests.helpers import wait_until
from tests.queue.test_deadlines import block_loop

TIMEOUT_S = 1.5  # the control-call deadline for this test (10 s by default)
N_CONSUMERS = 4  # two on each worker


@pytest.mark.timeout(60)
def test_stats_of_unanswering_consumers_costs_one_deadline_not_one_each(cluster_factory, tmp_path, monkeypatch):
    _, client = cluster_factory(2)
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp, n_consumers=N_CONSUMERS, isolation="thread")
    release = str(tmp_path / "release")
    try:
        assert len(cp.stats()) == N_CONSUMERS
        workers = sorted({h._address for h in cp.consumers})
        assert len(workers) == 2
        for i, w in enumerate(workers):
            marker = str(tmp_path / f"blocked-{i}")
            client.run(block_loop, 20.0, marker, release, workers=[w], wait=False)
            wait_until(lambda: os.path.exists(marker), timeout_s=30)
        monkeypatch.setattr(defaults, "CONTROL_CALL_TIMEOUT_S", TIMEOUT_S)
        started = time.monotonic()
        stats = cp.stats()
        took = time.monotonic() - started
        assert stats == []  # none answered: all left out
        # One deadline (plus a look at the scheduler), far below one per consumer (6 s).
        assert took < TIMEOUT_S + 1.5, f"stats took {took:.1f} s"
    finally:
        open(release, "w").close()
        monkeypatch.undo()
        cp.close()
        qp.close()
