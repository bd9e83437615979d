"""``QueuePool``'s settings, read from its validated :class:`~daskqueue.queue.config.PoolConfig`
(``self.config``) and its queue table: a mixin of :class:`~daskqueue.queue.pool.QueuePool`."""

from __future__ import annotations

from typing import Any

from daskqueue.queue.config import Durability

__all__ = ["PoolSettings"]


class PoolSettings:
    """The read-only settings of a queue pool."""

    config: Any
    table: Any
    _closed: bool

    @property
    def n_queues(self) -> int:
        """The pool's queues now (:meth:`add_queues` adds some, :meth:`remove_queue` takes
        one away; queue indices are never reused)."""
        return len(self.queue_indices)

    @property
    def queue_indices(self) -> list[int]:
        """The indices of the pool's queues now (a removed queue's index is not reused)."""
        return [] if self.table is None else self.table.indices()

    @property
    def durability(self) -> Durability:
        return self.config.durability

    @property
    def dirpath(self) -> str | None:
        """The pool directory (absolute), or ``None`` for a transient pool."""
        return self.config.dirpath

    @property
    def lease_timeout_s(self) -> float:
        return float(self.config.lease_timeout_s)

    @property
    def max_message_bytes(self) -> int:
        """The largest pickled message a queue accepts (for a durable pool, what also fits in a
        log segment)."""
        return self.config.message_limit()

    @property
    def put_batch_size(self) -> int:
        return self.config.put_batch_size

    @property
    def closed(self) -> bool:
        return self._closed
