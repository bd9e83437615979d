"""A queue whose worker dies while it hands off (the worker retires, then dies) is not left
moving: the hand-off runs on the pool's reaction thread under the follower's lock, so it has
ended (failed: the queue serves on where it was, ``end_move``) before the loss is reacted to,
and the loss reopens the queue (durable) or gives it up (transient) as any other. With the
fake actors of ``tests/queue/test_follow.py`` (no cluster): what is checked is the order of
the follower's own steps."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from daskqueue.queue.follow import Follower
from tests.queue.test_follow import FakeActorFuture, FakePool, FakeQueue


def _ok(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def _failed(error: BaseException) -> Future:
    f: Future = Future()
    f.set_exception(error)
    return f


class DyingQueue(FakeQueue):
    """A queue whose worker dies during its hand-off: ``hand_off`` fails, or (``after_state``)
    answers with its state and then nothing more does."""

    def __init__(self, address: str, *, after_state: bool = False) -> None:
        super().__init__(address)
        self.after_state = after_state

    def hand_off(self):
        self.calls.append("hand_off")
        return _ok(b"state") if self.after_state else _failed(OSError("worker died"))

    def handoff_done(self):
        self.calls.append("handoff_done")
        return _failed(OSError("worker died"))

    def handoff_abort(self):
        self.calls.append("handoff_abort")
        return _failed(OSError("worker died"))



@pytest.mark.timeout(10)
@pytest.mark.parametrize("after_state", [False, True])
@pytest.mark.parametrize("one_reaction", [False, True])
def test_a_durable_queue_whose_worker_dies_during_its_hand_off_is_reopened_on_the_loss(after_state, one_reaction):
    old, new = DyingQueue("w0", after_state=after_state), [FakeQueue("w1"), FakeQueue("w1")]
    # With its state in hand, the pool starts a successor, which it drops once the old queue
    # cannot be told that the hand-off is final: the reopened queue is the second actor.
    reopened = new[1] if after_state else new[0]
    pool = FakePool([old], [FakeActorFuture(h) for h in new], ["w0", "w1"])
    follower = Follower(pool)
    if one_reaction:  # retiring and gone in the same reaction (Reactions.merge drops the retiring)
        follower.on_membership(set(), {"w0"}, {"w0"})
    else:
        follower.on_membership(set(), set(), {"w0"})
        assert pool.table.handles[0] is old and not pool.table.moving  # serves on, as far as the pool knows
        pool.membership.workers = ["w1"]
        follower.on_membership(set(), {"w0"}, set())
    assert pool.table.handles[0] is reopened
    assert not pool.table.moving and not pool.table.lost and not follower._starting
