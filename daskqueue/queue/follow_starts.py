"""How a queue pool's follower starts a queue's successor actor (a mixin of
:class:`~daskqueue.queue.follow.Follower`, which owns the state; see there).

A successor is submitted bound to the workers that may hold it (``placeable_for``) and waited
for up to ``SUCCESSOR_WAIT_S``; a slower one is *starting* (``_starting``) and is installed by a
later membership event or by a call waiting for its queue (:meth:`finish_started`). One whose
every worker left meanwhile would never start (Dask keeps a task bound to gone workers until
one comes back): it is started again elsewhere (:meth:`restart_stranded`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from daskqueue import defaults, registry
from daskqueue.errors import QueueLostError
from daskqueue.queue.handles import call_all
from daskqueue.queue.successors import Start, Submitted

__all__ = ["StartsMixin"]

logger = logging.getLogger("daskqueue")


class StartsMixin:
    """``_submit_successor``, ``_await_start``, ``finish_started``, ``restart_stranded``,
    ``_start_now`` and ``_discard`` of the follower."""

    # Owned by Follower (as are placeable_for, reopen, install, _rest, _start_resting, _give_up, _handle_of).
    pool: Any
    table: Any
    _lock: threading.RLock
    _starting: dict[int, Start]
    _bound: dict[int, frozenset[str]]  # queue -> the workers its last successor was bound to

    def _submit_successor(self, q: int, handoff: bytes | None = None, *,
                          timeout_s: float = defaults.CONTROL_CALL_TIMEOUT_S) -> Submitted:
        """Submit a new actor for queue ``q`` on a worker that may hold one, with the
        ``handoff`` of its previous actor if it has one (sent to the worker within
        ``timeout_s``)."""
        free = self.placeable_for(q)
        if not free:
            raise QueueLostError(q, self.table.handles[q]._address, self.pool.durability)
        queue_class, args, kwargs = self.pool.actor_spec(q)
        client = self.pool.client
        state = None
        if handoff is not None:
            state = client.scatter(handoff, workers=free[:1], timeout=timeout_s)
        future = client.submit(queue_class, *args, **kwargs, handoff=state, actor=True, pure=False,
                               workers=free, allow_other_workers=False)
        self._bound[q] = frozenset(free)
        return Submitted(future, state)

    def _await_start(self, q: int, submitted: Submitted, state: bytes | None) -> None:
        """Wait up to ``SUCCESSOR_WAIT_S`` for a successor of queue ``q``; a slower one is
        finished later (:meth:`finish_started`)."""
        try:
            submitted.future.result(timeout=defaults.SUCCESSOR_WAIT_S)
        except TimeoutError:
            self._starting[q] = Start(submitted, time.monotonic(), state)
            logger.warning("queue %d of %r: its successor is still starting; it is installed when ready", q,
                           self.pool)
            return
        except BaseException:
            pass  # failed: handled as a finished start
        self._finish(q, Start(submitted, time.monotonic(), state))

    def finish_started(self, *, blocking: bool = True) -> None:
        """Install the successors that started since the membership thread stopped waiting
        for them, give up on those that failed or took ``QUEUE_START_TIMEOUT_S``. Called on
        every membership event, and (not blocking) by calls waiting for a moving queue."""
        if not self._starting or not self._lock.acquire(blocking=blocking):
            return
        try:
            for q, start in list(self._starting.items()):
                if start.future.done() or time.monotonic() - start.since > defaults.QUEUE_START_TIMEOUT_S:
                    del self._starting[q]
                    self._finish(q, start)
        finally:
            self._lock.release()

    def restart_stranded(self) -> None:
        """Start again, on the workers there are now, the successors still starting whose
        every worker left: Dask holds a task bound to workers that are all gone until one
        of them comes back (``no-worker``), so they would wait ``QUEUE_START_TIMEOUT_S``,
        and a reopened queue would then be given up. (Under the follower's lock.)"""
        alive = frozenset(self.pool.membership.workers)
        rested = False
        for q, start in list(self._starting.items()):
            bound = self._bound.get(q)
            if start.future.done() or bound is None or bound & alive:
                continue
            del self._starting[q]
            start.submitted.done_with_state()
            start.future.release()
            logger.warning("queue %d of %r: the workers its successor was to start on left (%s); starting "
                           "it elsewhere", q, self.pool, ", ".join(sorted(bound)))
            if start.state is not None or q in self.table.resting:
                self._rest(q, start.state)
                registry.register_pool(self.pool)
                rested = True
            else:
                self.reopen(q)
        if rested:
            self._start_resting()

    def _finish(self, q: int, start: Start) -> None:
        self._bound.pop(q, None)
        start.submitted.done_with_state()
        try:
            if not start.future.done():
                raise TimeoutError(f"not started within {defaults.QUEUE_START_TIMEOUT_S:g} s")
            handle = start.future.result(timeout=defaults.CONTROL_CALL_TIMEOUT_S)  # done: at once
        except BaseException as e:
            start.future.release()
            if start.state is not None or q in self.table.resting:
                self._rest(q, start.state)  # waits for another worker
                registry.register_pool(self.pool)
                logger.warning("queue %d: its successor failed (%s); it waits for another worker", q, e)
            else:
                logger.error("queue %d could not be reopened (%s); it stays lost", q, e)
                self._give_up(q)
            return
        self.install(q, self._handle_of(q, handle), start.future)
        logger.warning("queue %d of %r started on %s", q, self.pool, handle._address)

    def _start_now(self, q: int, state: bytes) -> tuple[Any, Any] | None:
        """A successor of queue ``q`` with ``state``, started within ``SUCCESSOR_WAIT_S``
        (trying twice), or None."""
        deadline = time.monotonic() + defaults.SUCCESSOR_WAIT_S
        for _ in range(2):
            submitted = None
            try:
                submitted = self._submit_successor(q, state, timeout_s=max(1.0, deadline - time.monotonic()))
                handle = submitted.future.result(timeout=max(0.0, deadline - time.monotonic()))
                submitted.done_with_state()
                return self._handle_of(q, handle), submitted.future
            except BaseException as e:
                logger.warning("queue %d: starting its successor failed (%s: %s)", q, type(e).__name__, e)
                if submitted is not None:
                    submitted.done_with_state()
                    submitted.future.release()
            if time.monotonic() >= deadline:
                break
        return None

    def _discard(self, q: int, handle: Any, future: Any) -> None:
        call_all([(f"queue {q}", handle)], "close", timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
        future.release()
