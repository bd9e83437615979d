"""``join()``'s warning over failed tasks counts the failures of this producer only: the
dead letters of another producer on the same pool (an attached client) are not its."""

from __future__ import annotations

import logging
import warnings

import pytest

from daskqueue import QueuePool
from tests import tasks
from tests.helpers import wait_until


@pytest.mark.timeout(60)
def test_join_warns_of_its_own_producers_failures_not_of_an_attached_ones(client, pools, caplog):
    qp = pools.queue(1, name="join-warning", max_retries=0)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "join-warning")
    try:
        for x in range(3):
            attached.submit(tasks.boom, x)  # dead-lettered at once: the attached producer's
        wait_until(lambda: len(attached.failures()) == 3, timeout_s=30)
        qp.submit(tasks.double, 1)
        with warnings.catch_warnings(record=True) as warned, caplog.at_level(logging.WARNING, "daskqueue"):
            warnings.simplefilter("always")
            cp.join(timeout=30)
        said = [str(w.message) for w in warned] + [r.getMessage() for r in caplog.records]
        assert not [s for s in said if s.startswith("join:")], said
        qp.submit(tasks.boom, 9)  # the owner's own failure is still reported
        with pytest.warns(RuntimeWarning, match="all 1 messages settled since the last join failed"):
            cp.join(timeout=30)
    finally:
        attached.close()
