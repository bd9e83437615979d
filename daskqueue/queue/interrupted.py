"""A send interrupted (Ctrl-C) part-way: where the interrupt may land, and reading the answers
of the puts already sent before it is raised (see ``daskqueue.queue.sending``).

A send's accounting of one put (its ids or claims, ``stored``, the pool's put count) is
several steps, and the user's ``KeyboardInterrupt`` may arrive between any two Python
bytecodes of the main thread. :class:`InterruptGuard` keeps it out of those steps: while a
send runs on the main thread, SIGINT goes through the guard, which delivers it at once where
the send waits for a queue, and defers it to the end of a step of accounting. The reading
after an interruption (:func:`read_rest`) is all accounting but for its waits, so a second
Ctrl-C stops it only while it waits, and the interruption is always raised with its
``stored_ids``.
"""

from __future__ import annotations

# ``signal.signal``/``getsignal`` convert the handler they return to an enum, which for a
# Python function fails through an exception: ~30 us a send on this machine, against ~1 us
# for the same calls to the C module underneath.
import _signal
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from daskqueue.queue.encode import PutBatch
    from daskqueue.queue.table import Pending

__all__ = ["INTERRUPTED_READ_S", "InterruptGuard", "SentPut", "read_rest"]

logger = logging.getLogger("daskqueue")

#: After an interruption, how long (seconds, overall) the answers of the puts sent are
#: awaited: the user pressed Ctrl-C, and waits through this (answers already in are read
#: whatever it is).
INTERRUPTED_READ_S = 10.0


class SentPut:
    """One put of a send, as it stands now: ``live`` is ``(queue, blob, token, call in
    flight)``, rewritten in one assignment whenever the put is (re)sent, so that an
    interruption at any point finds the put that may be stored (``None`` before it is first
    sent; a call in flight of None: it may have gone out, and is sent again under its token,
    which a queue that stored it answers with its ids, storing nothing)."""

    __slots__ = ("batch", "live")

    def __init__(self, batch: PutBatch) -> None:
        self.batch = batch
        self.live: tuple[int, bytes, bytes, Pending | None] | None = None


class InterruptGuard:
    """SIGINT during one send (a context manager; it has effect on the main thread only,
    where the interpreter delivers signals, and only over a Python handler such as the
    default one that raises ``KeyboardInterrupt``; elsewhere it changes nothing).

    While ``deferring`` is false, a SIGINT is handed to the handler it replaced at once (the
    ``KeyboardInterrupt`` is raised where the send is, as without the guard), and the guard
    turns ``deferring`` on as it raises: the send's handling of its interruption runs with
    interrupts deferred. While ``deferring`` is true, a SIGINT is noted (``pending``) and
    handed on by :meth:`resume`. Setting ``deferring`` is one attribute store, which no
    signal can split."""

    __slots__ = ("deferring", "pending", "late", "stopped", "_previous")

    def __init__(self) -> None:
        self.deferring = False
        #: A SIGINT that arrived while deferring, ``(signum, frame)``, not handed on yet.
        self.pending: tuple[int, Any] | None = None
        #: One still pending when the guarded work ended (see ``__exit__``), or noted so by
        #: :func:`read_rest`: handed on by ``deliver_late`` or ``raise_owed``.
        self.late: tuple[int, Any] | None = None
        #: The interrupt that stopped :func:`read_rest`'s reading, raised after an
        #: interruption that was not itself a Ctrl-C (see ``raise_owed``).
        self.stopped: BaseException | None = None
        self._previous: Callable[[int, Any], Any] | None = None

    def __enter__(self) -> "InterruptGuard":
        if threading.current_thread() is threading.main_thread():
            previous = _signal.getsignal(_signal.SIGINT)
            if callable(previous):
                self._previous = previous
                _signal.signal(_signal.SIGINT, self._handle)
        return self

    def __exit__(self, *_: Any) -> None:
        previous = self._previous
        if previous is None:
            return
        # The handler goes back before ``_previous`` is cleared: a SIGINT in between still
        # finds a handler to hand it to (see _handle).
        _signal.signal(_signal.SIGINT, previous)
        self._previous = None
        pending, self.pending = self.pending, None
        if pending is not None:
            # Not handed on here, whether or not the work failed: its KeyboardInterrupt would
            # leave the ``with`` with nothing of the work's outcome on it. The owner hands it
            # on (deliver_late, or raise_owed on an error) and adds that.
            self.late = pending

    def raise_owed(self, failure: BaseException) -> None:
        """The guarded work ended with ``failure``: raise the interrupt it owes the user,
        if any (a Ctrl-C deferred, ``late``, or the one that stopped :func:`read_rest`), as
        raised ``from failure`` and carrying its ``stored_ids``; a handler that raises
        nothing is called all the same, and this returns (the caller raises ``failure``).

        A ``failure`` that is an interrupt itself (not an ``Exception``: the user's
        ``KeyboardInterrupt``) owes nothing: a Ctrl-C deferred meanwhile has done its part,
        it stopped the reading of the answers (see read_rest). An ordinary error (a put
        that failed, the client's own bookkeeping) must not swallow a Ctrl-C: a caller that
        retries on ``Exception`` would never see it."""
        stopped, self.stopped = self.stopped, None
        if not isinstance(failure, Exception):
            self.late = None
            return
        try:
            if stopped is not None:
                self.late = None
                raise stopped
            self.deliver_late()
        except BaseException as interruption:
            if interruption is failure:
                raise
            interruption.stored_ids = getattr(failure, "stored_ids", None)  # type: ignore[attr-defined]
            raise interruption from failure

    def deliver_late(self) -> None:
        """Hand a SIGINT noted ``late`` on to the handler restored (its ``KeyboardInterrupt``
        is raised here, after the guarded work ended whole)."""
        late, self.late = self.late, None
        handler = _signal.getsignal(_signal.SIGINT)
        if late is not None and callable(handler):
            handler(*late)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.deferring:
            self.pending = (signum, frame)
            return
        # None only as ``__exit__`` ends (the handler it restores is in place then): the default.
        previous = self._previous or _signal.default_int_handler
        try:
            previous(signum, frame)
        except BaseException:
            self.deferring = True  # the interruption is handled with interrupts deferred
            raise

    def resume(self) -> None:
        """End a step that defers interrupts: hand on a SIGINT that came meanwhile (its
        ``KeyboardInterrupt`` is raised here, once the step is whole)."""
        self.deferring = False
        if self.pending is not None and self._previous is not None:
            signum, frame = self.pending
            self.pending = None
            self._handle(signum, frame)


def read_rest(read: Callable[[Any, float], None], sends: Sequence[Any], guard: InterruptGuard,
              read_s: float, errors: list[tuple[int, BaseException, int]], queue_of: Callable[[Any], int]) -> None:
    """After an interruption, read the answers of the puts still unread (``read(send,
    deadline)``: the first one's again, with its call and token, so a put is never stored
    twice), all within one ``read_s`` (plus at most one wait for a queue's move). Called with
    ``guard`` deferring; a second Ctrl-C stops the reading (at once while it waits for an
    answer, else before the next put; the puts left count as not stored; a put whose answer
    came is recorded whole before it stops), and that Ctrl-C is owed: noted in
    ``guard.stopped`` or ``guard.late``, for ``guard.raise_owed`` (raised if the
    interruption was an ordinary error). A put that fails, or whose answer is not in by
    then, counts as not stored (``read`` notes its failure in ``errors``, logged here); such a
    put may be stored all the same, as after a timed out put: its tasks run under ids unknown
    here, and their outcomes, claimed by no one, go to the pool's results. ``queue_of(send)``:
    the queue a put went to, for the log."""
    if not sends:
        return
    logger.info("reading %d sent puts' answers (Ctrl-C again to stop)", len(sends))
    deadline = time.monotonic() + read_s
    for k, send in enumerate(sends):
        if guard.pending is not None:  # a Ctrl-C deferred: it stops the reading, and is owed
            guard.late, guard.pending = guard.pending, None
            _stopped(len(sends) - k)
            break
        # Every statement run with interrupts not deferred is inside the outer ``try``: an
        # interrupt that lands anywhere there stops the reading, never leaves it (the caller
        # then raises its interruption with the stored ids).
        try:
            try:
                guard.deferring = False  # the wait for the answer may be interrupted
                read(send, deadline)
                guard.deferring = True
            except Exception as e:  # the client's own bookkeeping failed again
                guard.deferring = True
                errors.append((queue_of(send), e, 0))
        except BaseException as stop:  # the guard defers interrupts again as it raises
            guard.deferring = True
            guard.stopped = stop  # owed, after an interruption that was no interrupt itself
            _stopped(len(sends) - k)
            break
    for q, e, _ in errors:
        logger.warning("after an interruption, a put to queue %d failed: %s: %s", q, type(e).__name__, e)


def _stopped(left: int) -> None:
    logger.warning("interrupted again: the answers of %d puts sent are not read (their "
                   "tasks run, under ids unknown here)", left)
