"""The client's table of a pool's queue actors, and every call to them.

A :class:`QueueTable` holds each queue's handle and future by index, which queues are
removed, lost or moving, and what was put where. Its :meth:`call` / :meth:`answer` pair is
the one way the client calls a queue: a lost worker becomes :class:`QueueLostError` (a
durable queue reopening elsewhere :class:`QueueMovedError`), a lost scheduler
:class:`SchedulerLostError`, and every wait has an overall deadline (the caller's, else
``defaults.CALL_TIMEOUT_S``): a queue whose event loop is blocked costs a caller its
timeout, never more (:class:`QueueCallTimeoutError`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, NamedTuple

from daskqueue import defaults
from daskqueue.errors import (
    ActorReleasedError,
    NoWorkerError,
    QueueCallTimeoutError,
    QueueHandedOffError,
    QueueLostError,
    QueueMovedError,
    SchedulerLostError,
)
from daskqueue.queue.handles import LOST_CHECK_S, actor_lost, is_lost_worker
from daskqueue.serialize import SentFunctions

__all__ = ["QueueTable", "Pending", "deadline_after"]

logger = logging.getLogger("daskqueue")


class Pending(NamedTuple):
    """A call in flight to a queue, the handle it went to (the queue may move meanwhile),
    and the call (for errors, and to ask again)."""

    future: Any
    handle: Any
    method: str = "call"
    args: tuple[Any, ...] = ()


def deadline_after(timeout_s: float | None, *, now: float) -> float | None:
    """The monotonic deadline ``timeout_s`` after ``now`` (None: no timeout)."""
    return None if timeout_s is None else now + timeout_s


class QueueTable:
    """The queue actors of one pool, by queue index, and calls to them.

    ``scheduler_lost()`` returns the client's status once its scheduler is lost (else None);
    ``settled(q)`` how many outcomes of queue ``q`` the client received (a lost transient
    queue's error counts the messages put there without one).
    """

    def __init__(self, durability: str, handles: list[Any], futures: list[Any], *,
                 scheduler_lost: Callable[[], str | None], settled: Callable[[int], int],
                 dirpath: str | None = None) -> None:
        self.durability = durability
        self.dirpath = dirpath
        self.handles = handles
        self.futures = futures
        self.removed: set[int] = set()  # taken out by remove_queue (their indices stay taken)
        self.lost: dict[int, str] = {}  # queue index -> the address it was lost with
        self.moving: dict[int, threading.Event] = {}  # being reopened or handed off
        self.put_counts = [0] * len(handles)
        self.sent_funcs: list[SentFunctions] = [SentFunctions() for _ in handles]  # confirmed at each queue
        self._scheduler_lost = scheduler_lost
        self._settled = settled
        #: Called while a call waits for a moving queue (the pool finishes slow moves there).
        self.while_moving: Callable[[], None] = lambda: None
        #: Queues with no actor now (the pool is at rest, or had no worker yet): a call that
        #: needs one calls ``wake(q)`` (the pool asks for a worker) and waits up to
        #: ``WORKER_WAIT_S`` (then :class:`NoWorkerError`). Such a queue is also moving.
        self.resting: set[int] = set()
        self.wake: Callable[[int], None] = lambda q: None

    def grow(self, handles: list[Any], futures: list[Any]) -> None:
        """New queues, indices from the current count on."""
        self.handles += handles
        self.futures += futures
        self.put_counts += [0] * len(handles)
        self.sent_funcs += [SentFunctions() for _ in handles]

    def indices(self) -> list[int]:
        """The queues not removed."""
        return [i for i in range(len(self.handles)) if i not in self.removed]

    def in_service(self) -> list[tuple[int, Any]]:
        """``(index, handle)`` of every queue not removed, lost or moving."""
        return [(i, h) for i, h in enumerate(self.handles)
                if i not in self.removed and i not in self.lost and i not in self.moving]

    def reachable(self) -> list[int]:
        """The queues not removed and not lost (a moving one waits for its move)."""
        return [i for i in self.indices() if i not in self.lost]

    def lost_addresses(self) -> list[str]:
        """The addresses of the workers queues were lost with."""
        return sorted(set(self.lost.values()))

    # -- moving ---------------------------------------------------------------------------------

    def begin_move(self, q: int) -> None:
        """Queue ``q`` is being reopened or handed off: calls to it wait for the move."""
        self.moving[q] = threading.Event()

    def end_move(self, q: int) -> None:
        """Queue ``q`` serves again (moved, or staying where it was)."""
        moving = self.moving.pop(q, None)
        if moving is not None:
            moving.set()

    def replace(self, q: int, handle: Any, future: Any) -> tuple[Any, Any]:
        """Queue ``q`` lives at ``handle`` from now on; return the old future and handle."""
        old = self.futures[q], self.handles[q]
        self.handles[q], self.futures[q] = handle, future
        self.sent_funcs[q] = SentFunctions()
        self.end_move(q)
        return old

    def give_up(self, q: int) -> None:
        """Queue ``q`` is lost for good: every call that needs it raises QueueLostError."""
        self.lost[q] = self.handles[q]._address
        self.resting.discard(q)
        self.end_move(q)

    # -- calls ----------------------------------------------------------------------------------

    def call(self, q: int, method: str, *args: Any) -> Pending:
        """Call ``method`` of queue ``q``; the call in flight. Dask refuses a call to an actor
        whose worker it knows to be dead right here, so that is translated too."""
        handle = self.current(q)
        try:
            return Pending(getattr(handle, method)(*args), handle, method, args)
        except Exception as e:
            if not (self.durability == "durable" and is_lost_worker(e)):
                self.raise_if_lost(q, e, handle)
                raise
        # Dask knew of the death before the pool did: wait for the move, then call there.
        self.await_move(q, handle)
        handle = self.current(q)
        try:
            return Pending(getattr(handle, method)(*args), handle, method, args)
        except Exception as e:
            self.raise_if_lost(q, e, handle)
            raise

    def answer(self, q: int, pending: Pending, deadline: float | None = None) -> Any:
        """The result of a call to queue ``q``, by monotonic ``deadline`` (default: within
        ``CALL_TIMEOUT_S``), else :class:`QueueCallTimeoutError`; a lost worker as
        :class:`QueueLostError`.

        Waits in slices, checking whether Dask has marked the queue lost: in distributed
        2026.8 a call in flight when the actor's worker dies can stay unanswered for good (its
        retry awaits the lost key's future inside a callback that then never sets the result).
        """
        future, handle, method, _ = pending
        started = now = time.monotonic()
        if deadline is None:
            deadline = started + defaults.CALL_TIMEOUT_S
        while True:
            left = deadline - now
            try:
                # Every call of a task's path waits here: one clock read before its first slice.
                return future.result(timeout=LOST_CHECK_S if left >= LOST_CHECK_S else max(0.0, left))
            except TimeoutError as e:
                if future.done():  # answered as the wait timed out (or a remote TimeoutError)
                    return future.result()
                self.check_scheduler()
                if self.gone(q, handle):
                    moved = q not in self.lost and not actor_lost(handle)
                    if moved and (handle is not self.handles[q] or q in self.resting):
                        # Moved on (or parked): its old actor may be freed, and a call that
                        # reaches it through Dask's proxy is never answered.
                        raise QueueHandedOffError(q, getattr(handle, "_address", "?")) from e
                    if not (moved and q in self.moving and self.durability != "durable"):
                        raise self.lost_error(q, handle) from e
                    # A transient queue being handed off: its actor still answers (the result,
                    # or QueueHandedOffError once the hand-off began); wait on, by the deadline.
                now = time.monotonic()
                if now >= deadline:
                    raise QueueCallTimeoutError(q, method, round(deadline - started, 3)) from e
            except Exception as e:
                self.check_scheduler()
                self.raise_if_lost(q, e, handle)
                if isinstance(e, ActorReleasedError) and self._moved_from(q, handle):
                    # Sent before the move, it reached the old worker after the old actor was
                    # freed: nothing of it ran. Put again, or polled again, where the queue is.
                    raise QueueHandedOffError(q, getattr(handle, "_address", "?")) from e
                raise

    def ask(self, q: int, method: str, *args: Any, deadline: float | None = None) -> Any:
        """Call and answer a method that changes nothing, asking again where the queue moved
        to if it moved meanwhile."""
        return self.answer_or_ask_again(q, self.call(q, method, *args), deadline)

    def answer_or_ask_again(self, q: int, pending: Pending, deadline: float | None = None, *,
                            retry: type[QueueMovedError] = QueueMovedError, attempts: int = 2) -> Any:
        """:meth:`answer`, asking the queue again where it moved to if it moved meanwhile
        (the call raised ``retry``), up to ``attempts`` calls in all: for calls that change
        nothing, or that may be made twice; ``retry=QueueHandedOffError`` for a call that
        must not (the old actor did none of it)."""
        for _ in range(attempts - 1):
            try:
                return self.answer(q, pending, deadline)
            except retry:
                logger.info("queue %d moved while %s was under way; asking it again there", q, pending.method)
                pending = self.call(q, pending.method, *pending.args)
        return self.answer(q, pending, deadline)

    def await_move(self, q: int, handle: Any) -> None:
        """Wait (bounded) until queue ``q`` has moved away from ``handle``, is lost, or rests
        (parked with no worker to take it: a call made now wakes it)."""
        deadline = time.monotonic() + defaults.MOVE_WAIT_S
        while (self.handles[q] is handle and q not in self.lost and q not in self.resting
               and time.monotonic() < deadline):  # parked: the next call wakes it (current)
            self.check_scheduler()
            time.sleep(defaults.POLL_INTERVAL_S)

    def current(self, q: int) -> Any:
        """Queue ``q``'s handle; while a durable queue is being reopened elsewhere, wait for it
        (bounded). Raises :class:`QueueLostError` for a queue that is gone."""
        moving = self.moving.get(q)
        if moving is not None:
            resting = q in self.resting
            if resting:
                self.wake(q)
            wait_s = defaults.WORKER_WAIT_S if resting else defaults.MOVE_WAIT_S
            deadline = time.monotonic() + wait_s
            while not moving.wait(LOST_CHECK_S):
                self.check_scheduler()
                self.while_moving()
                if time.monotonic() > deadline:
                    if q in self.resting:
                        raise NoWorkerError(q, wait_s)
                    raise QueueMovedError(q, self.handles[q]._address)  # still recovering: ask again later
        if q in self.lost:
            raise self.lost_error(q)
        return self.handles[q]

    # -- errors ---------------------------------------------------------------------------------

    def check_scheduler(self) -> None:
        """Raise :class:`SchedulerLostError` if the client has lost its scheduler: every
        queue went with the workers, so no wait for one may go on."""
        status = self._scheduler_lost()
        if status is not None:
            raise SchedulerLostError(status, self.dirpath)

    def _moved_from(self, q: int, handle: Any) -> bool:
        """Whether queue ``q`` moved (or is moving) away from ``handle`` and is not lost."""
        return q not in self.lost and (q in self.moving or handle is not self.handles[q])

    def gone(self, q: int, handle: Any) -> bool:
        """Whether ``handle`` no longer stands for a live queue ``q`` (lost, or moved away)."""
        return q in self.lost or q in self.moving or handle is not self.handles[q] or actor_lost(handle)

    def raise_if_lost(self, q: int, error: BaseException, handle: Any) -> None:
        """Raise :class:`QueueLostError` from ``error`` if it says queue ``q``'s worker is gone."""
        if is_lost_worker(error):
            raise self.lost_error(q, handle) from error

    def lost_error(self, q: int, handle: Any = None, *, unsent: int = 0) -> QueueLostError:
        """The error for a call to lost queue ``q`` (through ``handle``). A durable queue is
        reopened elsewhere: a call in flight to the old actor gets :class:`QueueMovedError`.
        A transient one's error says how many messages went with it: put there with no
        outcome received by this client, plus ``unsent`` of the failing call."""
        handle = self.handles[q] if handle is None else handle
        if self.durability == "durable" and q not in self.lost:
            return QueueMovedError(q, handle._address)
        lost = None
        if self.durability == "transient":
            lost = max(0, self.put_counts[q] - self._settled(q)) + unsent
        return QueueLostError(q, handle._address, self.durability, lost)
