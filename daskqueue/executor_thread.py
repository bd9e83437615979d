"""The thread behind a :class:`~daskqueue.executor.QueueExecutor`: it sends the calls
submitted, in bulk, and resolves their futures from bulk outcome polls (the design is in
:mod:`daskqueue.executor`'s docstring). One per executor; it holds no reference to the
executor, so a forgotten executor is collected and its finalizer stops the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

from daskqueue import defaults
from daskqueue.errors import (ConfigurationError, DaskQueueError, NoConsumersError, QueueClosedError, QueueLostError,
                              QueueMovedError, SchedulerLostError)
from daskqueue.local_errors import local_error
from daskqueue.queue.encode import chunk_size, encode_calls
from daskqueue.queue.packing import pack_bound
from daskqueue.queue.router import batch_count

__all__ = ["Driver", "Call"]

logger = logging.getLogger("daskqueue")

#: The first pause between polls that brought nothing (doubling up to ``POLL_INTERVAL_S``).
FIRST_POLL_PAUSE_S = 0.001
#: An idle thread ends after this long (a new one starts with the next submission).
IDLE_EXIT_S = 5.0
#: Calls in flight fail with NoConsumersError after this long with no consumer pool started.
NO_CONSUMERS_GRACE_S = 2.0
#: Errors after which no outcome of the calls in flight can come: their futures fail.
_TERMINAL = (QueueClosedError, SchedulerLostError, ConfigurationError)  # a call that cannot work: fail, never retry

Call = tuple[Callable[..., Any], tuple[Any, ...], "dict[str, Any] | None"]


class _Claim:
    """The futures of one send, by position; the result collector routes their outcomes
    here (it calls ``succeed`` and ``fail``, on whichever thread polls) and they wait in
    ``arrived`` for the executor's thread. Only the first outcome of a position counts (an
    at-least-once delivery may bring two)."""

    def __init__(self, futures: list[Future], arrived: deque, ids: list[int | None]) -> None:
        self.futures = futures
        self.arrived = arrived
        self.ids = ids  # each call's message id (None: not stored), to know its queue
        self.n = len(futures)
        self.settled = 0
        self.abandoned = False
        self._done = bytearray(self.n)
        self._lock = threading.Lock()

    @property
    def complete(self) -> bool:
        return self.settled >= self.n

    def _first(self, position: int) -> bool:
        if self.abandoned or self._done[position]:
            return False
        self._done[position] = 1
        self.settled += 1
        return True

    def drop(self, position: int) -> None:
        """Position ``position`` has no outcome to come (its call was not stored)."""
        with self._lock:
            self._first(position)

    def lose(self, on_lost_queue: Callable[[int], bool]) -> list[Future]:
        """Positions whose message id ``on_lost_queue`` (their queue was lost: no outcome
        will come) have no outcome to come; return their futures that had none.

        ``on_lost_queue`` asks the collector (its lock): it is called before this claim's
        lock is taken, never under it, because a poll filing outcomes holds the collector's
        lock and then takes this claim's (the other order would deadlock the two threads)."""
        lost = [k for k, i in enumerate(self.ids) if i is not None and not self._done[k] and on_lost_queue(i)]
        with self._lock:
            return [self.futures[k] for k in lost if self._first(k)]

    def abandon(self) -> list[Future]:
        """Ignore every outcome from now on; return the futures that had none."""
        with self._lock:
            self.abandoned = True
            return [f for k, f in enumerate(self.futures) if not self._done[k]]

    def succeed(self, position: int, values: list[Any]) -> None:
        with self._lock:
            for k, value in enumerate(values):
                if self._first(position + k):
                    self.arrived.append((self.futures[position + k], True, value))

    def fail(self, position: int, error: BaseException) -> None:
        with self._lock:
            if self._first(position):
                self.arrived.append((self.futures[position], False, error))


class Driver:
    """The executor's thread and what it shares with submitters (see the module docstring)."""

    def __init__(self, pool: Any, options: Any, original_errors: bool) -> None:
        self.pool = pool
        self.options = options
        self.original_errors = original_errors
        self._wake = threading.Condition(threading.Lock())
        self._buffer: list[tuple[Future, Call]] = []
        self._arrived: deque[tuple[Future, bool, Any]] = deque()
        self._claims: list[_Claim] = []  # registered with the collector, not complete
        self._inflight = 0  # sent, no outcome yet (owned by the thread)
        self._stopping = False
        self._no_consumers_since: float | None = None  # in flight with no consumer started since
        self._lost: set[int] = set()  # queues lost for good: not polled, their calls failed
        self.thread: threading.Thread | None = None
        # The last thread started: ``thread`` is cleared by the thread itself a moment before
        # it ends, so shutdown(wait=True) joins this one.
        self._last_thread: threading.Thread | None = None
        #: Sends made and calls sent (what the batching achieved).
        self.sends = 0
        self.sent = 0

    # -- what other threads call --------------------------------------------------------------

    def add(self, future: Future, call: Call) -> None:
        with self._wake:
            if self._stopping:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._buffer.append((future, call))
            if self.thread is None:
                thread = threading.Thread(target=self._run, name=f"daskqueue-executor-{self.pool.name}",
                                          daemon=True)
                try:
                    thread.start()
                except BaseException:  # no thread to send it: this submission fails here
                    self._buffer.pop()
                    raise
                self.thread = self._last_thread = thread
            self._wake.notify()

    def stop(self, cancel_futures: bool = False) -> threading.Thread | None:
        """No more submissions; with ``cancel_futures``, drop the unsent ones. The thread
        ends once every sent call has its outcome; returned (the last one started, maybe
        ended or ending already: join it to know it ended), None if none ever started."""
        with self._wake:
            self._stopping = True
            dropped, self._buffer = (self._buffer, []) if cancel_futures else ([], self._buffer)
            self._wake.notify()
            thread = self._last_thread
        for future, _ in dropped:
            future.cancel()
            future.set_running_or_notify_cancel()  # wakes wait() / as_completed()
        return thread

    def cancel_unsent(self) -> int:
        """Cancel every future not sent yet; return how many."""
        with self._wake:
            dropped, self._buffer = self._buffer, []
        for future, _ in dropped:
            future.cancel()
            future.set_running_or_notify_cancel()
        return len(dropped)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        """The thread's body, guarded: if anything escapes the loop (a bug, a done-callback
        raising a ``BaseException``), every future it owns fails with that error instead of
        waiting forever, and the next submission starts a new thread."""
        try:
            self._loop()  # its normal end clears ``thread`` itself, under the lock
        except BaseException as e:
            logger.error("executor on %r: its thread failed; failing its futures", self.pool, exc_info=True)
            try:
                self._fail_everything(e)
            finally:
                with self._wake:
                    self.thread = None
                    left, self._buffer = self._buffer, []  # submitted while it failed
                if left:
                    self._fail_everything(e, left)

    def _fail_everything(self, error: BaseException, buffered: list[tuple[Future, Call]] | None = None) -> None:
        """Fail every future this thread owns (buffered, claimed, arrived) with ``error``."""
        if not isinstance(error, Exception):  # a KeyboardInterrupt must not stop the callers
            cause, error = error, DaskQueueError(f"the thread of the executor on {self.pool!r} failed: {error!r}")
            error.__cause__ = cause
        if buffered is None:
            with self._wake:
                buffered, self._buffer = self._buffer, []
        futures = [f for f, _ in buffered if f.set_running_or_notify_cancel()]
        while self._arrived:
            futures.append(self._arrived.popleft()[0])
        for claim in self._claims:
            try:
                self.pool.collector.release(claim)
            except BaseException:
                logger.debug("executor on %r: releasing a claim failed", self.pool, exc_info=True)
            futures += claim.abandon()
        self._claims, self._inflight = [], 0
        for future in futures:
            try:
                if not future.done():
                    future.set_exception(error)
            except BaseException:  # a done-callback again, or a race with another setter
                logger.debug("executor on %r: failing a future raised", self.pool, exc_info=True)

    def _loop(self) -> None:
        pause = FIRST_POLL_PAUSE_S
        while True:
            with self._wake:
                while not self._buffer and not self._inflight and not self._arrived:
                    if self._stopping or not self._wake.wait(IDLE_EXIT_S):
                        # Stopped, or idle for long: end (the next submission starts a new
                        # thread), so an executor left open holds no thread.
                        if not (self._buffer or self._inflight or self._arrived):
                            self.thread = None
                            return
                taken, self._buffer = self._buffer, []
            if taken:
                self._send(taken)
            if self._inflight and not self._arrived:
                self._poll()
            if self._resolve() or taken:
                pause = FIRST_POLL_PAUSE_S
                continue
            with self._wake:  # nothing came: wait a little, or until a submission
                if self._inflight and not self._buffer and not self._arrived:
                    self._wake.wait(pause)
            pause = min(pause * 2, defaults.POLL_INTERVAL_S)

    def _send(self, taken: list[tuple[Future, Call]]) -> None:
        """Send the live calls of ``taken`` as one submission (a bad call fails alone)."""
        live = [(f, c) for f, c in taken if f.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            batches = self._encode([c for _, c in live])
        except Exception:  # one call cannot be pickled (or is too large): find which
            live = self._drop_unencodable(live)
            if not live:
                return
            batches = self._encode([c for _, c in live])
        futures = [f for f, _ in live]
        ids: list[int | None] = [None] * len(futures)
        claim = _Claim(futures, self._arrived, ids)
        try:
            if self.pool.closed:
                raise QueueClosedError(f"{self.pool!r} is closed")
            # The claim is registered as each put is answered (as the pool's map does), and
            # no other thread polls meanwhile (see Sender.send).
            self.pool.sender.send(batches, n=len(futures), claim=claim, queue=self._route(), into=ids)
            error = None
        except Exception as e:  # part may be stored (it runs): those futures wait for it
            error = e
        for k, message_id in enumerate(ids):
            if message_id is None:
                claim.drop(k)
                futures[k].set_exception(error)  # type: ignore[arg-type]
        # Counted from the ids, not the claim: other threads' polls may have settled some.
        stored = len(ids) - ids.count(None)
        if stored:
            self._claims.append(claim)
            self._inflight += stored
        self.sends += 1
        self.sent += stored

    def _route(self) -> int | None:
        return self.pool.router.route(self.options.type, self.options.key)

    def _encode(self, calls: list[Call]) -> list[Any]:
        pool, n = self.pool, len(calls)
        spread = pool.router.spread(self._route())
        per_put = pool.config.put_batch_size
        limit = pool.config.message_limit(self.options.type, self.options.key)
        # Packed like batch_submit's (one pickle per put group on a memory pool).
        packed = pack_bound(n, self.options, limit, durable=pool.config.durability == "durable")
        return encode_calls(calls, self.options, size=chunk_size(n, n_queues=spread, put_batch_size=per_put),
                            batches=batch_count(n, spread=spread, put_batch_size=per_put), limit=limit,
                            pack_max_bytes=packed)

    def _drop_unencodable(self, live: list[tuple[Future, Call]]) -> list[tuple[Future, Call]]:
        kept = []
        for future, call in live:
            try:
                self._encode([call])
                kept.append((future, call))
            except Exception as e:
                future.set_exception(e)
        return kept

    def _poll(self) -> None:
        if self.pool.closed:
            self._fail_inflight(QueueClosedError(f"{self.pool!r} was closed with these calls in flight"))
            return
        try:
            arrived = self._poll_queues()
        except Exception as e:
            if self.pool.closed:
                error: BaseException = QueueClosedError(f"{self.pool!r} was closed with these calls in flight")
                error.__cause__ = e
            elif isinstance(e, QueueLostError) and not isinstance(e, QueueMovedError):
                self._fail_lost_queue(e)
                return
            elif isinstance(e, _TERMINAL):
                error = e
            else:
                logger.info("executor on %r: fetching outcomes failed (%s); trying again", self.pool, e)
                time.sleep(defaults.POLL_INTERVAL_S)
                return
            logger.warning("executor on %r: failing %d calls in flight: %s", self.pool, self._inflight, error)
            self._fail_inflight(error)
            return
        if not arrived:
            self._check_consumers()

    def _poll_queues(self) -> int:
        """Fetch the outcomes of every queue (one call each, at once), or once a queue is
        lost (a pool-wide poll raises for it from then on), of each other queue in turn."""
        if not self._lost:
            return self.pool.poll_outcomes()
        return sum(self.pool.poll_outcomes(queue_index=q) for q in self.pool.table.indices() if q not in self._lost)

    def _fail_lost_queue(self, error: QueueLostError) -> None:
        """Transient queue ``error.queue_index`` is lost with its worker: fail the calls it
        held (their outcomes never come) with ``error``; the other queues' calls go on."""
        q = error.queue_index
        self._lost.add(q)
        queue_of = self.pool.collector.queue_of  # where each call is now (messages may move)
        failed = [f for claim in self._claims for f in claim.lose(lambda i: queue_of(i) == q)]
        logger.warning("executor on %r: queue %d was lost: failing its %d calls in flight", self.pool, q, len(failed))
        self._inflight -= len(failed)
        for future in failed:
            if not future.done():
                future.set_exception(error)
        self._release_complete()

    def _check_consumers(self) -> None:
        """Fail the calls in flight with :class:`NoConsumersError` once no consumer pool of
        the queue pool has been started for ``NO_CONSUMERS_GRACE_S`` (as the pool's ``map``
        and ``join`` raise it): nothing would ever run them."""
        if self.pool.has_running_consumers():
            self._no_consumers_since = None
            return
        now = time.monotonic()
        if self._no_consumers_since is None:
            self._no_consumers_since = now
        elif now - self._no_consumers_since >= NO_CONSUMERS_GRACE_S:
            self._no_consumers_since = None
            error = NoConsumersError(f"{self._inflight:,} calls of the executor on {self.pool!r} are in flight "
                                     "and no consumer pool of the queue pool is started (never, or stopped "
                                     "or closed meanwhile)")
            logger.warning("executor on %r: %s", self.pool, error)
            self._fail_inflight(error)

    def _fail_inflight(self, error: BaseException) -> None:
        for claim in self._claims:
            self.pool.collector.release(claim)
            for future in claim.abandon():
                self._inflight -= 1
                if not future.done():
                    future.set_exception(error)
        self._claims = []

    def _resolve(self) -> int:
        """Resolve every future whose outcome arrived; release the claims that are complete."""
        n = 0
        while self._arrived:
            future, ok, value = self._arrived.popleft()
            self._inflight -= 1
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(local_error(value, original=self.original_errors))
            n += 1
        if n:
            self._release_complete()
        return n

    def _release_complete(self) -> None:
        """Let the collector forget the claims whose every call has its outcome."""
        done = [c for c in self._claims if c.complete]
        if done:
            self._claims = [c for c in self._claims if not c.complete]
            for claim in done:
                self.pool.collector.release(claim)
