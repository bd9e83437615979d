"""What a pool's queues are told of one another and of its consumers: each queue's peers
(where the others are, so that they announce work to each other) and, in a typed pool, how
many batches each consumer pool runs at once (so that type shares are computed pool-wide).

:class:`PoolPeers` is the queue pool's (its :class:`~daskqueue.queue.follow.Follower` holds
it): the pool tells the queues at start, after a queue moved or was added or removed, and
when a consumer pool's slots change. Every call is bounded by ``CONTROL_CALL_TIMEOUT_S``; a
failure is logged, not raised (the queues then know less, and work still runs).
"""

from __future__ import annotations

import logging
from typing import Any

from daskqueue import defaults
from daskqueue.queue.handles import call_all, queue_ref

__all__ = ["PoolPeers"]

logger = logging.getLogger("daskqueue")


class PoolPeers:
    """Tells the queues of ``table`` (a :class:`~daskqueue.queue.table.QueueTable`) their
    peers and the consumer pools' slots."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.slots: dict[str, int] = {}  # consumer pool id -> its running slots (typed pools)

    def share(self) -> None:
        """Tell every queue where the others are (they announce to each other when they
        have work) and, in a typed pool, the consumer pools' slots: at start, and after a
        queue moved (its successor starts knowing nothing). Every queue gets it, a pool's
        only one too: the call starts its housekeeping."""
        table = self.table
        # A resting queue has no actor to announce to: it hears of the others when it starts.
        refs = [None if i in table.removed or i in table.resting else queue_ref(h) for i, h in enumerate(table.handles)]
        live = [(f"queue {i}", h) for i, h in table.in_service()]
        failed = call_all(live, "set_peers", refs, timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
        for owner, slots in list(self.slots.items()):
            failed += call_all(live, "set_slots", owner, slots, timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
        if failed:
            logger.warning("telling the queues their peers and slots failed: %s", failed)

    def set_slots(self, owner: str, slots: int, *, typed: bool) -> None:
        """Consumer pool ``owner`` runs ``slots`` batches at once (0: stopped or closed)."""
        if not typed or self.slots.get(owner, 0) == slots:
            return
        self.slots[owner] = slots
        if not slots:
            del self.slots[owner]
        live = [(f"queue {i}", h) for i, h in self.table.in_service()]
        failed = call_all(live, "set_slots", owner, slots, timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
        if failed:
            logger.warning("telling the queues the consumers' slots failed: %s", failed)

