"""The result collector's fetching: polls in flight, and holds (a mixin of
:class:`~daskqueue.results.ResultCollector`, which owns the state; see there).

The collector's lock guards its state only: no thread holds it across a network wait. A
fetch carries the cursors it was sent with, and its answer is applied only if they are
still the collector's (else it is dropped: a fetch tells its queue "I have everything before
my cursor", which was true when it was sent, so the queue still holds whatever a dropped
answer carried beyond the cursors). So fetches may overlap freely, and at most one *long*
poll per queue is kept in flight: a small send starts one as soon as its put is sent
(:meth:`PollsMixin.prime`), so that the outcome travels back as soon as it is settled, and a
waiting ``result`` waits on that poll instead of sending its own after ``submit`` returned.
A send with claims *holds* its queues (:meth:`PollsMixin.holding`): answers applied
meanwhile are kept aside, and filed once its claims are registered.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from daskqueue import defaults
from daskqueue.errors import QueueCallTimeoutError, QueueClosedError, QueueLostError, QueueMovedError
from daskqueue.serialize import ResultRecord, decode_records

__all__ = ["PollsMixin", "PRIME_MAX_MESSAGES", "PRIMED_WAIT_S"]

logger = logging.getLogger("daskqueue")

#: How long a poll started by a send waits at its queue for an outcome.
PRIMED_WAIT_S = defaults.RESULT_POLL_SLICE_S

#: Sends of at most this many messages start a long poll (:meth:`ResultCollector.prime`): a
#: single ``submit`` waited on by ``result`` is the case; a big send's outcomes are read by
#: ``map`` / ``as_completed`` rounds, which a poll answered early would not help.
PRIME_MAX_MESSAGES = 16

#: How long ``poll(first=True)`` waits on one of its long polls before it looks at the
#: others (see ``PollsMixin._settle_first``): how late an outcome at another queue may be seen.
FIRST_SLICE_S = 0.002


@dataclass(eq=False)
class _Fetch:
    """A ``fetch_outcomes`` call in flight to queue ``q``, sent with ``cursors``."""

    q: int
    pending: Any
    cursors: tuple[int, int]
    wait_s: float = 0.0
    sent_at: float = 0.0

    def done(self) -> bool:
        """Whether its answer is here (a pending without a future: answered already)."""
        future = getattr(self.pending, "future", None)
        return future is None or bool(future.done())


class PollsMixin:
    """``prime``, ``poll`` and ``holding`` of the result collector."""

    # Owned by ResultCollector.
    _n: int
    producer: int
    _call: Callable[..., Any]
    _answer: Callable[[int, Any, float | None], Any]
    _cursors: list[int]
    _dead_cursors: list[int]
    settled: list[int]
    removed: set[int]
    _lock: threading.RLock
    _closing: list[Any]
    _long: dict[int, _Fetch]
    _holds: dict[int, int]
    _held: dict[int, list[tuple[list[ResultRecord], list[Any]]]]

    def _take_results(self, records: list[ResultRecord]) -> int:
        raise NotImplementedError

    def _take_dead(self, q: int, dead: list[tuple[int, int, bytes, Any]]) -> int:
        raise NotImplementedError

    def _release_completed(self) -> None:
        raise NotImplementedError

    def prime(self, queues: Iterable[int]) -> None:
        """A small send went to these queues: start a long poll at each that has none in
        flight, so that its outcome comes back as soon as it is settled (see the module
        docstring). Waits only for a queue that began moving since its put (the call waits
        for the move), never inside the lock; a queue that cannot be called now is skipped
        (the next poll finds out why)."""
        if self._call is None:
            return
        with self._lock:
            wanted = [q for q in set(queues) if q not in self._long and q not in self.removed and q < self._n]
        for q in wanted:
            try:
                fetch = self._send(q, PRIMED_WAIT_S)
            except Exception as e:  # an optimisation only: the waiting call reports it
                logger.debug("queue %d: no outcome poll started: %s: %s", q, type(e).__name__, e)
                continue
            self._keep_long(fetch)

    def forget(self, q: int) -> None:
        """Queue ``q`` was removed (and its outcomes fetched): drop its long poll in flight,
        which no poll reads any more (a removed queue is not polled). Polls do it too, for
        every removed queue (:meth:`_drop_removed`)."""
        with self._lock:
            self._long.pop(q, None)

    def _drop_removed(self) -> None:
        """Drop the long polls of removed queues (under the lock): left in flight by a
        ``first`` poll or a send's prime, they were kept in ``_long`` for good."""
        if self.removed and self._long:
            for q in [q for q in self._long if q in self.removed]:
                del self._long[q]

    def holds_all(self) -> bool:
        """Whether every queue a poll asks (those not removed) is held now (see :meth:`holding`):
        then a poll files nothing until the holds end."""
        with self._lock:
            return bool(self._holds) and all(q in self._holds for q in range(self._n) if q not in self.removed)

    def _send(self, q: int, wait_s: float) -> _Fetch:
        """Send a ``fetch_outcomes`` to queue ``q`` with the cursors as they are now.

        Call it without the lock: the call waits for a queue that is moving or resting (up
        to ``MOVE_WAIT_S`` / ``WORKER_WAIT_S``, see ``QueueTable.current``), and inside the
        lock every thread filing or taking outcomes of any queue waited as long. Cursors read
        before that wait are still true (they only move on; an answer to cursors that moved
        meanwhile is dropped, see the module docstring)."""
        with self._lock:
            cursors = (self._cursors[q], self._dead_cursors[q])
        # The owner's call keeps its old form (queues of older versions answer it).
        args = cursors + (wait_s,) + ((self.producer,) if self.producer else ())
        return _Fetch(q, self._call(q, "fetch_outcomes", *args), cursors, wait_s, time.monotonic())

    def poll(self, *, wait_s: float = 0.0, queue_index: int | None = None, deadline: float | None = None,
             first: bool = False) -> int:
        """Fetch what the queues have (one call per queue); return how many outcomes arrived.

        With ``queue_index``, ask only that queue; with ``wait_s``, a queue with nothing new
        holds the call up to ``wait_s`` until an outcome arrives (a long poll; one already in
        flight to that queue is waited on instead of sending another). Each answer is waited
        for until ``deadline`` (monotonic; default: the table's own). The lock is never held
        while waiting: sends and other polls go on meanwhile. With ``first`` (and ``wait_s``),
        return as soon as a queue's answer brought outcomes: the long polls of the queues not
        answered yet stay in flight (the next poll reads them), so a stream's caller uses
        what came instead of waiting on the next queue's poll meanwhile.
        """
        with self._lock:
            self._drop_removed()
            which = [q for q in range(self._n) if q not in self.removed] if queue_index is None else [queue_index]
            # Long polls answered already: applied first, so that fresh fetches carry the
            # cursors they moved to.
            answered = [self._long.pop(q) for q in which if q in self._long and self._long[q].done()]
        n = sum(self._settle_fetch(f, deadline) for f in answered)
        if n and wait_s > 0:
            return n  # the caller looks, and waits again if what it wants was not there
        fetches = []
        for q in which:  # sent outside the lock: a send may wait for a moving queue
            if q in self.removed and queue_index is None:
                continue  # removed since ``which`` was read: closed, its outcomes fetched
            with self._lock:
                fetch = self._long.get(q) if wait_s > 0 else None
            if fetch is None:
                try:
                    fetch = self._send(q, wait_s)
                except QueueMovedError:
                    continue  # still moving after the wait: the next poll asks again
                except (QueueClosedError, QueueLostError):
                    if q in self.removed:
                        continue  # removed while an earlier send waited: as above
                    raise
                if wait_s > 0:
                    self._keep_long(fetch)
            fetches.append(fetch)
        start = time.monotonic()
        if first and wait_s > 0 and len(fetches) > 1:
            return self._settle_first(fetches, deadline, start + wait_s)
        for fetch in fetches:
            if fetch.wait_s > 0 and fetch.sent_at + fetch.wait_s > start + wait_s:
                # Somebody else's longer poll (a primed one): wait only as long as asked.
                n += self._settle_fetch(fetch, deadline, until=start + wait_s)
            else:
                n += self._settle_fetch(fetch, deadline)
        return n

    def _settle_first(self, fetches: list[_Fetch], deadline: float | None, until: float) -> int:
        """``poll(first=True)``'s wait on its long polls: every answered fetch is applied, and
        once some brought outcomes their count is returned (the others stay in flight); until
        then each is waited on in turn for a slice (``FIRST_SLICE_S``), up to ``until``. The
        fetches are lane calls read by the waiting thread itself or Dask calls, nothing one
        wait can cover together: waited on one after another, in queue order, an outcome of
        the last of 32 queues sat unseen until the long polls of the others had ended."""
        n = 0
        left = fetches
        while True:
            waiting = []
            for fetch in left:
                if fetch.done():
                    n += self._settle_fetch(fetch, deadline)
                else:
                    waiting.append(fetch)
            now = time.monotonic()
            if n or not waiting or now >= until:
                return n  # those not answered stay in flight (the next poll reads them)
            fetch = waiting[0]
            n += self._settle_fetch(fetch, deadline, until=min(until, now + FIRST_SLICE_S))
            # In turn, each waited on alike; one applied is not looked at again (one answered
            # just after its slice is too: it stays in flight, and the next poll applies it).
            left = waiting[1:] + ([] if fetch.done() else [fetch])

    def _settle_fetch(self, fetch: _Fetch, deadline: float | None, until: float | None = None) -> int:
        """Wait for a fetch's answer (outside the lock) and apply it; the outcomes filed.
        With ``until``, stop waiting then (0: not answered yet; the poll stays in flight)
        unless the poll itself is overdue or ``deadline`` comes first."""
        q = fetch.q
        if until is not None:
            overdue = fetch.sent_at + fetch.wait_s + defaults.CALL_TIMEOUT_S
            if deadline is None or until < deadline:
                if until < overdue:
                    try:
                        answer = self._answer(q, fetch.pending, until)
                    except QueueCallTimeoutError:
                        return 0
                    except QueueMovedError:
                        self._drop_long(fetch)
                        return 0  # as below: the next poll asks the queue where it moved to
                    except (QueueClosedError, QueueLostError):
                        self._drop_long(fetch)
                        if q in self.removed:
                            return 0  # see below
                        raise
                    except BaseException:
                        self._drop_long(fetch)
                        raise
                    return self._apply(fetch, answer)
                deadline = overdue if deadline is None else min(deadline, overdue)
        try:
            answer = self._answer(q, fetch.pending, deadline)
        except QueueMovedError:
            self._drop_long(fetch)
            return 0  # the next poll asks the queue where it moved to
        except (QueueClosedError, QueueLostError):
            self._drop_long(fetch)
            if q in self.removed:
                return 0  # removed under this poll: ``remove_queue`` fetched its outcomes before it closed
            raise
        except BaseException:
            self._drop_long(fetch)
            raise
        return self._apply(fetch, answer)

    def _keep_long(self, fetch: _Fetch) -> None:
        """Keep a long poll just sent as its queue's poll in flight, unless another thread
        sent one meanwhile (that one stays; this one is still waited on by its sender)."""
        with self._lock:
            if fetch.q not in self._long and fetch.q not in self.removed:
                self._long[fetch.q] = fetch

    def _drop_long(self, fetch: _Fetch) -> None:
        with self._lock:
            if self._long.get(fetch.q) is fetch:
                del self._long[fetch.q]

    def _apply(self, fetch: _Fetch, answer: tuple[int, bytes, int, list[Any]]) -> int:
        """File a fetch's answer if it was sent with the cursors as they are now (else drop
        it: see the module docstring); the outcomes filed."""
        q = fetch.q
        cursor, blob, dead_cursor, dead = answer
        records = decode_records(blob)
        with self._lock:
            if self._long.get(q) is fetch:
                del self._long[q]
            if (self._cursors[q], self._dead_cursors[q]) != fetch.cursors:
                return 0  # another fetch's answer moved them: this one's is in it or still queued
            if dead_cursor < fetch.cursors[1]:
                # The queue was rebuilt from disk and numbers its dead letters afresh
                # (replayed or purged ones are gone): read them all again; a failure
                # already known is recorded once.
                dead_cursor = 0
            self._cursors[q], self._dead_cursors[q] = cursor, dead_cursor
            if not records and not dead:
                return 0
            if self._holds.get(q):
                self._held.setdefault(q, []).append((records, dead))
                return 0
            return self._file(q, records, dead)

    def _file(self, q: int, records: list[ResultRecord], dead: list[Any]) -> int:
        """File outcomes of queue ``q`` (under the lock); how many."""
        got = self._take_results(records) + self._take_dead(q, dead)
        self.settled[q] += got
        if self._closing and got:
            self._release_completed()
        return got

    @contextlib.contextmanager
    def holding(self, queues: Iterable[int]) -> Iterator[None]:
        """While inside, outcomes from these queues are kept aside, not filed; filed on the
        way out. A send with claims holds its queues until its claims are registered, so
        that no outcome of the send lands in the results first (where another caller may
        take it, and the ``map`` would wait forever). Waits for nothing but the lock.

        Exact under an interruption (a ``KeyboardInterrupt`` between any two lines): the
        counts are set to values computed first (setting them again is harmless), so an
        interrupted entry puts back the counts it found, the exit releases only a hold that
        was taken, and a release interrupted while setting the counts sets them all (an
        interruption in the lines before it starts still leaves the hold). Counting up one
        queue at a time and recording it after left a hold taken but unrecorded, never
        released: that queue's outcomes were never filed."""
        qs = set(queues)
        held = False  # whether every hold of ``qs`` was taken (and is released on the way out)
        try:
            with self._lock:
                before = {q: self._holds.get(q, 0) for q in qs}
                try:
                    self._set_holds({q: n + 1 for q, n in before.items()})
                    held = True
                except BaseException:
                    self._set_holds(before)  # as found, however far the counting went
                    held = False
                    raise
            yield
        finally:
            if held:
                self._unhold(qs)

    def _unhold(self, qs: set[int]) -> None:
        """Release a hold of each of ``qs``; file what was kept aside for a queue no longer held."""
        with self._lock:
            after = {q: self._holds.get(q, 1) - 1 for q in qs}
            try:
                self._set_holds(after)
            except BaseException:
                self._set_holds(after)  # the same counts again: the rest of an interrupted setting
                raise
            finally:
                for q, n in after.items():
                    if not n:
                        for records, dead in self._held.pop(q, ()):
                            self._file(q, records, dead)

    def _set_holds(self, counts: dict[int, int]) -> None:
        """Set the holds of these queues (under the lock; 0: not held). Idempotent."""
        for q, n in counts.items():
            if n > 0:
                self._holds[q] = n
            else:
                self._holds.pop(q, None)
