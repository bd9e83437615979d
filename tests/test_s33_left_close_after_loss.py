"""A queue pool closed right after a queue's worker died, before the pool heard of it through
its membership thread: it asks the scheduler which workers are gone and does not call (nor
warn of) the queue lost there, and returns within seconds.

Before, ``close`` called the dead queue too: the call failed (``closing queues failed:
... OSError``), or, needing a new connection to the dead address, waited out
``STOP_TIMEOUT_S`` (25 s). The consumer pool's ``close`` has done this since stop 32
(``Members.ask_all``)."""

from __future__ import annotations

import logging
import time

import pytest

from daskqueue import QueuePool
from tests import tasks
from tests.helpers import kill_worker

#: Well under the 25 s a call to a dead worker may wait, and well over what close takes.
BOUND_S = 8.0


@pytest.mark.timeout(60)
def test_closing_a_queue_pool_right_after_a_queues_worker_died_skips_that_queue_and_warns_of_nothing(
        cluster_factory, caplog):
    _, client = cluster_factory(2)
    qp = QueuePool(client, 2)
    victim = qp.queues[1]._address
    assert qp.queues[0]._address != victim
    ids = qp.batch_submit([(tasks.double, x) for x in range(4)])  # both queues in use
    assert len(ids) == 4
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="daskqueue"):
        # At once: the pool has not heard of the loss yet (its membership thread has not
        # marked the queue lost), and closing drops the change it has not reacted to.
        kill_worker(client, victim)
        started = time.monotonic()
        qp.close()
        took = time.monotonic() - started
    warned = [r.getMessage() for r in caplog.records
              if r.name == "daskqueue" and r.levelno >= logging.WARNING and "was lost with its worker" not in r.getMessage()]
    assert took < BOUND_S, f"close took {took:.1f} s"
    assert not warned, warned
