"""Two-phase hand-off against real queue actors: a hand-off whose successor cannot start
leaves the old queue serving (``handoff_abort``), never a zombie that refuses every call.
Needs the actor's ``handoff_done`` / ``handoff_abort`` (skipped on actors without them)."""

from __future__ import annotations

import pytest

from daskqueue import defaults

from daskqueue.queue.transient import TransientQueue

pytestmark = pytest.mark.skipif(not hasattr(TransientQueue, "handoff_abort"),
                                reason="queue actors without two-phase hand-off")


class CannotStart:
    """A successor that fails to start (a worker out of memory, a broken environment)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("this successor cannot start")


def test_a_hand_off_without_a_successor_leaves_the_old_queue_serving(pools, monkeypatch):
    qp = pools.queue(1)
    old = qp.queues[0]
    ids = qp.put_many(range(10))
    monkeypatch.setattr(qp, "actor_spec", lambda q: (CannotStart, (q,), {}))
    monkeypatch.setattr(defaults, "SUCCESSOR_WAIT_S", 4.0)  # what it proves needs no 20 s wait
    qp.follower.hand_off(0)
    assert qp.queues[0] is old and not qp.table.moving
    assert qp.put_many(range(5))  # it serves again: no QueueHandedOffError
    assert qp.stats()[0].pending == len(ids) + 5
