"""The queue table of a pool handle that does not own its pool: what a closed, moved or
removed queue means to it.

A :class:`HandleTable` is a :class:`~daskqueue.queue.table.QueueTable` that cannot ask the
owner: it learns from the registry (on the scheduler) where the owner recorded each queue.
A queue that answers "closed" was removed by the owner (the pool still registered) or the
pool was closed (:class:`PoolClosedError`); a durable queue that moved is looked up again
there; a transient queue the owner no longer lists is lost. The handles it serves are
:mod:`daskqueue.queue.attached`'s.

A queue's old actor freed by its worker (:class:`ActorReleasedError`) is not "closed": the
owner registers where a queue went before it frees the old actor, so the registry says
whether the queue moved (a hand-off: the call is made again there), rests in the owner's
client waiting for a worker (calls wait for it, as the owner's do: ``WORKER_WAIT_S``, then
:class:`NoWorkerError`), or was removed. A registry that still names the freed actor after
``MOVE_WAIT_S`` means the owner is gone (its client died with the pool open).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from daskqueue import defaults
from daskqueue.errors import ActorReleasedError, PoolClosedError, QueueClosedError, QueueHandedOffError, QueueLostError
from daskqueue.queue.loop_queue import LoopQueue
from daskqueue.queue.table import Pending, QueueTable

__all__ = ["HandleTable"]

logger = logging.getLogger("daskqueue")


class HandleTable(QueueTable):
    """A handle's table: a queue closed under it means its owner closed the pool; a queue
    moved (a durable one reopened elsewhere, or one whose old actor was freed) is looked up
    again in the registry, where the owner records where it went (``refresh(q)``: the
    registered handle, or None), or that it rests (then calls wait for it, see :meth:`rest`)."""

    pool_name = ""
    refresh: Any = None
    on_removed: Any = None  # called with a queue the owner removed: the handle stops using it
    removed_by_owner: Any = None  # q -> whether the registry lists queue q as removed
    resting_by_owner: Any = None  # q -> whether the registry lists queue q as resting
    demand: Any = None  # asks the scheduler for a worker for resting queues (a Demand)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wake = self._wake
        self.while_moving = self._follow_resting

    def call(self, q: int, method: str, *args: Any) -> Pending:
        """Also: a call that finds its queue's worker gone after the queue moved on (or to
        rest, see :meth:`lost_error`) is made again where the queue is now."""
        try:
            return super().call(q, method, *args)
        except QueueHandedOffError:
            return super().call(q, method, *args)

    def answer(self, q: int, pending: Pending, deadline: float | None = None) -> Any:
        try:
            return super().answer(q, pending, deadline)
        except PoolClosedError:
            raise
        except ActorReleasedError as e:
            raise self._released_error(q, pending.handle) from e
        except QueueClosedError as e:
            raise self._closed_error(q) from e

    def _released_error(self, q: int, handle: Any) -> Exception:
        """A call reached queue ``q``'s actor after its worker released it (nothing of the
        call ran): removed by the owner (closed), or moved on or resting (a hand-off: the
        caller asks again where the queue is). The owner registers where a queue went before
        it frees the old actor, so the registry is asked again, up to ``MOVE_WAIT_S``, only
        to ride out a slow read; past that, the owner is gone (:class:`PoolClosedError`)."""
        if self.refresh is None:  # no registry to ask (a handle inside a task)
            return self._closed_error(q)
        if q not in self.removed and q not in self.lost and self._removed_by_owner(q):
            return self._removed_error(q)
        deadline = time.monotonic() + defaults.MOVE_WAIT_S
        while True:
            if q in self.removed:  # (the registry read below says so)
                return self._removed_error(q)
            if q in self.lost:
                return self.lost_error(q, handle)
            if self.handles[q] is not handle or q in self.resting:
                return QueueHandedOffError(q, getattr(handle, "_address", "?"))
            if time.monotonic() >= deadline:
                return PoolClosedError(self.pool_name, f"queue {q}'s actor was released and the registry "
                                       "still names it: the pool's owner is gone (its client closed "
                                       "without closing the pool)")
            try:
                self._follow(q, handle)
            except PoolClosedError as e:
                return e
            if self.handles[q] is handle and q not in self.resting:
                time.sleep(defaults.POLL_INTERVAL_S * 5)

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
            return self._removed_error(q)
        return PoolClosedError(self.pool_name)

    def _removed_error(self, q: int) -> QueueClosedError:
        """Queue ``q`` was removed by its owner: this handle stops using it."""
        if q not in self.removed and self.on_removed is not None:
            self.on_removed(q)
        return QueueClosedError(f"queue {q} of pool {self.pool_name!r} was removed by its owner "
                                "(the pool is open): nothing more goes to that queue")

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
                and q not in self.resting and time.monotonic() < deadline:
            self._follow(q, handle)
            if self.handles[q] is handle:
                time.sleep(defaults.POLL_INTERVAL_S * 5)

    def lost_error(self, q: int, handle: Any = None, *, unsent: int = 0) -> QueueLostError:
        """Also: a queue the owner removed (the registry lists it so) is gone as removed, not
        lost: its actor is released, so a call to it may fail as if its worker died. And a
        transient queue handed off before its worker left (retired: the registry names its
        successor, or lists it as resting) moved: :class:`QueueHandedOffError`."""
        if q in self.removed or (q not in self.lost and self._removed_by_owner(q)):
            return self._removed_error(q)  # type: ignore[return-value]
        handle = self.handles[q] if handle is None else handle
        if self.refresh is not None and (self.durability == "durable" or q not in self.lost):
            self._follow(q, handle)
            if self.durability == "transient" and q not in self.lost \
                    and (self.handles[q] is not handle or q in self.resting):
                return QueueHandedOffError(q, getattr(handle, "_address", "?"))
        return super().lost_error(q, handle, unsent=unsent)

    def _removed_by_owner(self, q: int) -> bool:
        """Whether the registry lists queue ``q`` as removed by the pool's owner."""
        return _registry_says(self.removed_by_owner, q)

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
        if new is not None and ((new.key, new._address) != (handle.key, handle._address) or q in self.resting):
            logger.info("queue %d of pool %r moved to %s: following it", q, self.pool_name, new._address)
            self.serve(q, new)
        elif new is None and self._removed_by_owner(q):
            if self.on_removed is not None:
                self.on_removed(q)  # released by its owner, not lost: see lost_error
        elif new is None and self._resting_by_owner(q):
            self.rest(q)
        elif new is None and self.durability == "transient" and q not in self.lost:
            logger.warning("queue %d of pool %r was lost (the owner no longer lists it)", q, self.pool_name)
            self.give_up(q)

    # -- resting: queues whose state waits in the owner's client for a worker ---------------------

    def rest(self, q: int) -> None:
        """The registry lists queue ``q`` as resting: calls to it wait for it (``current``)."""
        if q not in self.resting:
            logger.info("queue %d of pool %r rests in its owner's client: waiting for a worker", q, self.pool_name)
        if q not in self.moving:
            self.begin_move(q)
        self.resting.add(q)

    def serve(self, q: int, handle: Any) -> None:
        """Queue ``q`` serves at ``handle`` (the registry names it): calls go there now."""
        self.resting.discard(q)  # first: a call woken by the move must not find it resting
        self.replace(q, handle, None)
        if self.demand is not None:
            self.demand.withdraw(q)

    def current(self, q: int) -> Any:
        """Also: a wait for a resting queue that ends without it withdraws this handle's
        demand for a worker (a demand left would keep the cluster from going back to zero)."""
        try:
            return super().current(q)
        except BaseException:
            if self.demand is not None and q in self.resting:
                self.demand.withdraw(q)
            raise

    def _wake(self, q: int) -> None:
        """A call waits for resting queue ``q``: ask for a worker (the owner starts the queue
        on one that joins), under this handle's own demand, withdrawn when the wait ends."""
        if self.demand is not None:
            self.demand.want([q])

    def _follow_resting(self) -> None:
        """While a call waits for a resting queue: look the resting queues up again."""
        if self.refresh is not None:
            for q in sorted(self.resting):
                self._follow(q, self.handles[q])

    def _resting_by_owner(self, q: int) -> bool:
        """Whether the registry lists queue ``q`` as resting in the owner's client."""
        return _registry_says(self.resting_by_owner, q)


def _registry_says(ask: Any, q: int) -> bool:
    """``ask(q)``, a question to the registry about queue ``q``; False without one, or when
    the registry is not read (it is for finding pools: the caller's error stands)."""
    if ask is None:
        return False
    try:
        return bool(ask(q))
    except Exception as e:
        logger.debug("queue %d: registry not read: %s", q, e)
        return False
