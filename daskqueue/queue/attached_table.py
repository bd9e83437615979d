"""The queue table of a pool handle that does not own its pool: what a closed, moved or
removed queue means to it.

A :class:`HandleTable` is a :class:`~daskqueue.queue.table.QueueTable` that cannot ask the
owner: it learns from the registry (on the scheduler) where the owner recorded each queue.
A queue that answers "closed" was removed by the owner (the pool still registered) or the
pool was closed (:class:`PoolClosedError`); a durable queue that moved is looked up again
there; a transient queue the owner no longer lists is lost. The handles it serves are
:mod:`daskqueue.queue.attached`'s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from daskqueue import defaults
from daskqueue.errors import PoolClosedError, QueueClosedError, QueueLostError
from daskqueue.queue.loop_queue import LoopQueue
from daskqueue.queue.table import Pending, QueueTable

__all__ = ["HandleTable"]

logger = logging.getLogger("daskqueue")


class HandleTable(QueueTable):
    """A handle's table: a queue closed under it means its owner closed the pool; a queue
    moved (a durable one reopened elsewhere) is looked up again in the registry, where the
    owner records where it went (``refresh(q)``: the registered handle, or None)."""

    pool_name = ""
    refresh: Any = None
    on_removed: Any = None  # called with a queue the owner removed: the handle stops using it
    removed_by_owner: Any = None  # q -> whether the registry lists queue q as removed

    def answer(self, q: int, pending: Pending, deadline: float | None = None) -> Any:
        try:
            return super().answer(q, pending, deadline)
        except PoolClosedError:
            raise
        except QueueClosedError as e:
            raise self._closed_error(q) from e

    def _closed_error(self, q: int) -> QueueClosedError:
        """Queue ``q`` answered that it is closed: the pool was closed, or (the pool still
        registered) its owner took that queue out of the pool (``remove_queue``)."""
        registered = False
        if self.refresh is not None:
            try:
                registered, _ = self.refresh(q)
            except Exception as e:  # the registry is for finding pools: say what is likeliest
                logger.debug("queue %d: registry not read: %s", q, e)
        if registered:
            if self.on_removed is not None:
                self.on_removed(q)
            return QueueClosedError(f"queue {q} of pool {self.pool_name!r} was removed by its owner "
                                    "(the pool is open): nothing more goes to that queue")
        return PoolClosedError(self.pool_name)

    def await_move(self, q: int, handle: Any) -> None:
        """Wait (bounded) until the registry names another actor for queue ``q`` (a task
        handle: until its consumer has been told where the queue moved)."""
        if isinstance(handle, LoopQueue):
            deadline = time.monotonic() + defaults.MOVE_WAIT_S
            while not handle.moved_since_last_call() and time.monotonic() < deadline:
                time.sleep(defaults.POLL_INTERVAL_S)
            return None
        if self.refresh is None:
            return super().await_move(q, handle)
        deadline = time.monotonic() + defaults.MOVE_WAIT_S
        while self.handles[q] is handle and q not in self.lost and q not in self.removed \
                and time.monotonic() < deadline:
            self._follow(q, handle)
            if self.handles[q] is handle:
                time.sleep(defaults.POLL_INTERVAL_S * 5)

    def lost_error(self, q: int, handle: Any = None, *, unsent: int = 0) -> QueueLostError:
        """Also: a queue the owner removed (the registry lists it so) is gone as removed, not
        lost: its actor is released, so a call to it may fail as if its worker died."""
        if q in self.removed or (q not in self.lost and self._removed_by_owner(q)):
            if q not in self.removed and self.on_removed is not None:
                self.on_removed(q)
            return QueueClosedError(  # type: ignore[return-value]
                f"queue {q} of pool {self.pool_name!r} was removed by its owner (the pool is open): "
                "nothing more goes to that queue")
        if self.refresh is not None and self.durability == "durable":
            self._follow(q, self.handles[q] if handle is None else handle)
        return super().lost_error(q, handle, unsent=unsent)

    def _removed_by_owner(self, q: int) -> bool:
        """Whether the registry lists queue ``q`` as removed by the pool's owner."""
        if self.removed_by_owner is None:
            return False
        try:
            return bool(self.removed_by_owner(q))
        except Exception as e:  # the registry is for finding pools: the caller's error stands
            logger.debug("queue %d: registry not read: %s", q, e)
            return False

    def gone(self, q: int, handle: Any) -> bool:
        """Also asks the registry (while a call waits, once a slice): a call in flight when
        its queue's worker died may never be answered, and no follower tells this handle."""
        if super().gone(q, handle):
            return True
        if self.refresh is not None:
            self._follow(q, handle)
        return q in self.lost or q in self.removed or handle is not self.handles[q]

    def _follow(self, q: int, handle: Any) -> None:
        """Look queue ``q`` up in the registry: moved (another actor), lost (a transient
        queue the owner no longer lists), or the pool closed (:class:`PoolClosedError`)."""
        try:
            registered, new = self.refresh(q)
        except Exception as e:  # the registry is for finding pools: the caller's error stands
            logger.debug("queue %d: registry not read: %s", q, e)
            return
        if not registered:
            raise PoolClosedError(self.pool_name, "it is no longer registered")
        if new is not None and (new.key, new._address) != (handle.key, handle._address):
            logger.info("queue %d of pool %r moved to %s: following it", q, self.pool_name, new._address)
            self.replace(q, new, None)
        elif new is None and self._removed_by_owner(q):
            if self.on_removed is not None:
                self.on_removed(q)  # released by its owner, not lost: see lost_error
        elif new is None and self.durability == "transient" and q not in self.lost:
            logger.warning("queue %d of pool %r was lost (the owner no longer lists it)", q, self.pool_name)
            self.give_up(q)
