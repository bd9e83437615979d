"""Time limits: interrupt a task that runs too long, as Dramatiq's time limit does.

One watchdog thread per process keeps the deadline of every item running with a limit. When
one passes, it raises :class:`~daskqueue.errors.TimeLimitExceeded` inside that item's thread
(``PyThreadState_SetAsyncExc``): the task fails like any other failure (retried, then
dead-lettered). What this cannot interrupt: a thread blocked in a C call (``time.sleep`` is
one it can, since Python checks between sleeps; a long ``numpy`` call or a socket read without
a timeout is not), or code that catches the exception and goes on. For those the consumer
stops extending the lease once the item is ``TIME_LIMIT_GRACE_S`` past its limit (the queue
then redelivers it, an attempt counted), frees the slot and leaves the thread behind; in a
child process, the child is killed and restarted.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import time
from typing import Callable, TypeVar

from daskqueue.errors import TimeLimitExceeded

__all__ = ["run_limited", "watchdog", "Watchdog"]

logger = logging.getLogger("daskqueue")

T = TypeVar("T")


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> int:
    """Have thread ``thread_id`` raise ``exc`` at its next bytecode (None: cancel that)."""
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                      ctypes.py_object(exc) if exc is not None else None)


class _Armed:
    __slots__ = ("thread_id", "deadline", "limit_s", "fired_at")

    def __init__(self, thread_id: int, deadline: float, limit_s: float) -> None:
        self.thread_id = thread_id
        self.deadline = deadline
        self.limit_s = limit_s
        self.fired_at: float | None = None


class Watchdog:
    """Deadlines of the items running with a time limit in this process (see the module)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, _Armed] = {}  # token -> what it watches
        self._by_thread: dict[int, _Armed] = {}
        self._tokens = itertools.count(1)
        self._thread: threading.Thread | None = None

    def arm(self, limit_s: float) -> int:
        """Watch the calling thread for ``limit_s`` seconds; return the token to disarm."""
        tid = threading.get_ident()
        armed = _Armed(tid, time.monotonic() + limit_s, limit_s)
        with self._cond:
            token = next(self._tokens)
            self._armed[token] = armed
            self._by_thread[tid] = armed
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="daskqueue-time-limits", daemon=True)
                self._thread.start()
            self._cond.notify()
        return token

    def disarm(self, token: int) -> None:
        """Stop watching; if the limit fired and its exception has not been raised yet,
        cancel it and raise :class:`TimeLimitExceeded` here instead (deterministically)."""
        armed = None
        try:
            with self._cond:
                armed = self._armed.pop(token, None)
                if armed is not None and self._by_thread.get(armed.thread_id) is armed:
                    del self._by_thread[armed.thread_id]
        finally:
            # The interruption may land right here, before the entry went: never leave it.
            if armed is None:
                with self._cond:
                    left = self._armed.pop(token, None)
                    if left is not None and self._by_thread.get(left.thread_id) is left:
                        del self._by_thread[left.thread_id]
        if armed is not None and armed.fired_at is not None:
            _raise_in(armed.thread_id, None)
            raise TimeLimitExceeded(f"the task ran past its time limit of {armed.limit_s:g} s")

    def overdue_s(self, thread_id: int) -> float:
        """How long ago the item running on ``thread_id`` was interrupted and still runs
        (0: it was not, or it ended)."""
        with self._cond:
            armed = self._by_thread.get(thread_id)
            if armed is None or armed.fired_at is None:
                return 0.0
            return time.monotonic() - armed.fired_at

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                waiting = [a for a in self._armed.values() if a.fired_at is None]
                for a in waiting:
                    if a.deadline <= now:
                        a.fired_at = now
                        _raise_in(a.thread_id, TimeLimitExceeded)
                        logger.warning("a task ran past its time limit of %g s; interrupting it", a.limit_s)
                pending = [a.deadline for a in waiting if a.fired_at is None]
                self._cond.wait(None if not pending else max(0.0, min(pending) - now) + 0.001)


#: This process's watchdog.
watchdog = Watchdog()


def run_limited(call: Callable[[], T], limit_s: float) -> T:
    """``call()``, interrupted with :class:`TimeLimitExceeded` after ``limit_s`` seconds."""
    token = watchdog.arm(limit_s)
    try:
        return call()
    finally:
        watchdog.disarm(token)
