"""What a consumer pool asks of its queue pool: a mixin of the ``QueuePool`` facade.

A ``ConsumerPool`` works on a queue pool through these methods only: it registers itself
(and then hears of moved queues, resizes and retiring workers through its own
``on_queue_moved``, ``on_queues_changed``, ``on_workers_retiring``), and asks for the
queues' handles, the homes its consumers take in turn, the workers queues were lost with,
and whether the scheduler is still there. It tells the pool its running slots.

The mixin uses the pool's public parts only (``table``, ``router``, ``follower``); the
registered consumer pools are its own state, weakly held (a consumer pool dropped by its
user does not stay registered).
"""

from __future__ import annotations

import weakref
from typing import Any

from daskqueue.queue.handles import queue_ref

__all__ = ["ServesConsumerPools"]


class ServesConsumerPools:
    """``register_consumer_pool``, ``consumer_pools``, ``has_running_consumers``,
    ``queue_refs``, ``homes``, ``lost_addresses``, ``serving``, ``set_slots``,
    ``check_scheduler``."""

    # Owned by the facade (QueuePool._start).
    table: Any
    router: Any
    follower: Any

    def _init_consumer_pools(self) -> None:
        self._consumer_pools: weakref.WeakSet[Any] = weakref.WeakSet()

    def register_consumer_pool(self, consumer_pool: Any) -> None:
        """A ``ConsumerPool`` works on this pool: it hears of moves (``on_queue_moved``),
        resizes (``on_queues_changed``) and retiring workers (``on_workers_retiring``), and
        ``map`` checks one is running. (Was ``attach(consumer_pool)``, which still works.)"""
        self._consumer_pools.add(consumer_pool)

    def consumer_pools(self) -> list[Any]:
        return list(self._consumer_pools)

    def has_running_consumers(self) -> bool:
        return any(cp.running for cp in self.consumer_pools())

    def queue_refs(self) -> list[Any]:
        """What consumers call: ``queue_ref`` tuples by queue index, None for a removed one."""
        table = self.table
        return [None if i in table.removed else queue_ref(h) for i, h in enumerate(table.handles)]

    @property
    def homes(self) -> list[int]:
        """The queues consumers take as homes, in turn: those new messages go to."""
        return list(self.router.targets)

    def lost_addresses(self) -> list[str]:
        """The workers queues of this pool were lost with."""
        return self.table.lost_addresses()

    def serving(self) -> dict[int, Any]:
        """``{index: handle}`` of the queues that serve now (not removed, lost or moving)."""
        return dict(self.table.in_service())

    def set_slots(self, owner: str, slots: int) -> None:
        """Consumer pool ``owner`` runs ``slots`` batches at once (0: stopped or closed); a
        typed pool shares its running slots out by type."""
        self.follower.set_slots(owner, slots, typed=self.router.typed)

    def check_scheduler(self) -> None:
        """Raise :class:`SchedulerLostError` if the client has lost its scheduler."""
        self.table.check_scheduler()
