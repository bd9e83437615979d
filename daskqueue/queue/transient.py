"""The in-memory queue actor."""

from __future__ import annotations

import pickle
from typing import Any

from daskqueue.queue.base import QueueActorBase

__all__ = ["TransientQueue"]


class TransientQueue(QueueActorBase):
    """A queue actor that keeps its messages in the memory of its worker.

    Fast and simple; its messages (and results not yet fetched) are lost if its worker dies.
    Use :class:`DurableQueue` where they must survive.

    Actor methods (all ``async``, on the worker's event loop, never blocking):
    ``put_batch(blob)``, ``get_batch(max_items, wait_s)``, ``get_batch_nowait(max_items)``,
    ``settle(lease_id, blob)``, ``extend(lease_ids)``, ``record_outcomes(...)``,
    ``get_functions(digests)``, ``fetch_results(cursor)``, ``fetch_dead(cursor)``,
    ``stats()``, ``close()``; ``hand_off(confirm_s)`` then ``handoff_done()`` or
    ``handoff_abort()`` (see :mod:`daskqueue.queue.handoff`); ``move_out``, ``adopt``, ``fence_keys``,
    ``holds_keys``; the dead-letter admin ``dead_letters``, ``replay_dead``, ``purge``; for
    ``/metrics``, ``metrics_sample()``; between the queues of one pool, ``set_peers``,
    ``work_at`` (a peer has work for others) and, in a fair or capped pool, ``peer_counts``
    and ``set_slots``. Calls after ``close()`` raise
    :class:`QueueClosedError`, after ``hand_off()`` :class:`QueueHandedOffError`.
    """

    kind = "transient"

    def __init__(self, index: int = 0, *, handoff: bytes | None = None, **kwargs: Any) -> None:
        """``handoff``: what ``hand_off()`` of this queue's previous actor returned; this
        actor goes on with that state (the pool moves a queue off a retiring worker so)."""
        super().__init__(index, **kwargs)
        if handoff is not None:
            self._import_handoff(pickle.loads(handoff))
