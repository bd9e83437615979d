"""``QueuePool.executor()``: the pool as a :class:`concurrent.futures.Executor`.

Every tool that takes an executor (``executor=`` arguments, ``tqdm.contrib.concurrent``,
joblib through :mod:`daskqueue.joblib_backend`) can run its work on a queue pool.

One thread per executor (started by the first ``submit``) does all the remote work, so that
neither submitting nor waiting costs an actor call per future:

* ``submit`` only appends the call to a buffer and wakes the thread; the thread takes the
  whole buffer at once and sends it as one submission (one put per queue). Submissions made
  while a send is under way (from any number of threads) ride on the next one: the batch grows
  with the rate of submission, with no timer.
* Outcomes are fetched in bulk (one ``fetch_outcomes`` call per queue per poll), and routed by
  the pool's result collector straight to the futures of each send (a *claim* on the send's
  ids, as ``map`` uses), not through ``results()``: a caller taking the pool's results does
  not take these. (An outcome that another thread's poll fetched between the put's answer
  and the claim is taken from the pool's results at once.)
  Polls back off from 1 ms to ``POLL_INTERVAL_S`` while nothing arrives, and stop while
  nothing is in flight (an idle executor makes no call).

Futures resolve on that thread, so ``add_done_callback`` callbacks run there: a slow callback
delays the other futures. A future is ``running()`` from when its call is sent: a sent call
cannot be taken back from the queues, so ``cancel()`` succeeds only before (in the buffer) and
honestly returns False after.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import cloudpickle

from daskqueue import defaults
from daskqueue.errors import QueueClosedError, QueueLostError, QueueMovedError, RemoteTaskError, SchedulerLostError
from daskqueue.local_errors import local_error
from daskqueue.messages import split_id
from daskqueue.queue.encode import chunk_size, encode_calls
from daskqueue.queue.options import put_options
from daskqueue.queue.router import batch_count
from daskqueue.validate import check_number

__all__ = ["QueueExecutor", "Executing", "ByValue"]

logger = logging.getLogger("daskqueue")

#: A ``map`` keeps at most this many calls in flight unless told otherwise.
MAP_WINDOW = 1_000
#: The first pause between polls that brought nothing (doubling up to ``POLL_INTERVAL_S``).
FIRST_POLL_PAUSE_S = 0.001
#: Errors after which no outcome of the calls in flight can come: their futures fail.
_TERMINAL = (QueueClosedError, SchedulerLostError)

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any] | None]


def _apply_chunk(fn: Callable[..., Any], chunk: list[tuple[Any, ...]]) -> list[Any]:
    """One task of ``map(..., chunksize=n)``: ``fn`` over a chunk of argument tuples."""
    return [fn(*args) for args in chunk]


class ByValue:
    """A callable that pickles ``fn`` with cloudpickle, so that what it holds inside (a
    ``partial``'s function, a joblib batch's calls) travels by value when it must (defined
    in ``__main__``, a lambda, a closure): the pool pickles a task's function by reference
    when the function's own module is importable, without looking inside it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_by_value, (cloudpickle.dumps(self.fn),))


def _by_value(data: bytes) -> ByValue:
    return ByValue(cloudpickle.loads(data))


class _Claim:
    """The futures of one send, by position; the result collector routes their outcomes
    here (it calls ``succeed`` and ``fail``, on whichever thread polls) and they wait in
    ``arrived`` for the executor's thread. Only the first outcome of a position counts (an
    at-least-once delivery may bring two)."""

    def __init__(self, futures: list[Future], arrived: deque) -> None:
        self.futures = futures
        self.arrived = arrived
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


class _Driver:
    """The executor's thread and what it shares with submitters (see the module
    docstring). It holds no reference to the executor, so a forgotten executor is
    collected and its finalizer stops the thread."""

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
        self.thread: threading.Thread | None = None
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
                self.thread = threading.Thread(target=self._run, name=f"daskqueue-executor-{self.pool.name}",
                                               daemon=True)
                self.thread.start()
            self._wake.notify()

    def stop(self, cancel_futures: bool = False) -> None:
        """No more submissions; with ``cancel_futures``, drop the unsent ones. The thread
        ends once every sent call has its outcome."""
        with self._wake:
            self._stopping = True
            dropped, self._buffer = (self._buffer, []) if cancel_futures else ([], self._buffer)
            self._wake.notify()
        for future, _ in dropped:
            future.cancel()
            future.set_running_or_notify_cancel()  # wakes wait() / as_completed()

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
        pause = FIRST_POLL_PAUSE_S
        while True:
            with self._wake:
                while not self._buffer and not self._inflight and not self._arrived:
                    if self._stopping:
                        return
                    self._wake.wait()
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
        try:
            if self.pool.closed:
                raise QueueClosedError(f"{self.pool!r} is closed")
            ids = self.pool.sender.send(batches, n=len(futures), queue=self._route())
            error = None
        except Exception as e:  # part may be stored (it runs): those futures wait for it
            ids, error = getattr(e, "stored_ids", None) or [None] * len(futures), e
        claim = _Claim(futures, self._arrived)
        for k, message_id in enumerate(ids):
            if message_id is None:
                claim.drop(k)
                futures[k].set_exception(error)  # type: ignore[arg-type]
        stored = claim.n - claim.settled
        if stored:
            self._claim(claim, ids)
            self._claims.append(claim)
            self._inflight += stored
        self.sends += 1
        self.sent += stored

    def _claim(self, claim: _Claim, ids: list[int | None]) -> None:
        """Route the outcomes of ``ids`` to ``claim``. Registered after the put answered, so
        an outcome fetched meanwhile by another thread's poll (another executor's, a
        ``results()`` call) went to the pool's results: it is taken from there."""
        collector = self.pool.collector
        run: list[int] = []  # [queue, first seq, count, first position]
        for position, message_id in enumerate(ids):
            if message_id is None:
                continue
            q, seq = split_id(message_id)
            if run and run[0] == q and run[1] + run[2] == seq and run[3] + run[2] == position:
                run[2] += 1
                continue
            if run:
                collector.claim(run[0], run[1], run[2], claim, run[3])
            run = [q, seq, 1, position]
        if run:
            collector.claim(run[0], run[1], run[2], claim, run[3])
        position_of = {i: k for k, i in enumerate(ids) if i is not None}
        for message_id, value in collector.take(set(position_of)):
            if isinstance(value, RemoteTaskError):
                claim.fail(position_of[message_id], value)
            else:
                claim.succeed(position_of[message_id], [value])

    def _route(self) -> int | None:
        return self.pool.router.route(self.options.type, self.options.key)

    def _encode(self, calls: list[Call]) -> list[Any]:
        pool, n = self.pool, len(calls)
        spread = pool.router.spread(self._route())
        per_put = pool.config.put_batch_size
        return encode_calls(calls, self.options, size=chunk_size(n, n_queues=spread, put_batch_size=per_put),
                            batches=batch_count(n, spread=spread, put_batch_size=per_put),
                            limit=pool.config.message_limit(self.options.type, self.options.key))

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
            self.pool.poll_outcomes()
        except Exception as e:
            if self.pool.closed:
                error: BaseException = QueueClosedError(f"{self.pool!r} was closed with these calls in flight")
                error.__cause__ = e
            elif isinstance(e, _TERMINAL) or (isinstance(e, QueueLostError) and not isinstance(e, QueueMovedError)):
                error = e
            else:
                logger.info("executor on %r: fetching outcomes failed (%s); trying again", self.pool, e)
                time.sleep(defaults.POLL_INTERVAL_S)
                return
            # Which queue held which call is not tracked: every call in flight fails.
            logger.warning("executor on %r: failing %d calls in flight: %s", self.pool, self._inflight, error)
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
        if n and self._claims:
            done = [c for c in self._claims if c.complete]
            if done:
                self._claims = [c for c in self._claims if not c.complete]
                for claim in done:
                    self.pool.collector.release(claim)
        return n


class QueueExecutor(Executor):
    """A :class:`concurrent.futures.Executor` running calls on a queue pool (see the module
    docstring); made by :meth:`QueuePool.executor`. Needs a started ``ConsumerPool`` on the
    pool to make progress (futures wait for one, as the pool's messages do).

    * ``submit(fn, *args, **kwargs)`` returns a :class:`concurrent.futures.Future`. Its
      ``result()`` raises the task's own exception type when it can be rebuilt here (see
      :mod:`daskqueue.local_errors`), chained from the :class:`RemoteTaskError` that holds
      the remote traceback; else that ``RemoteTaskError``. Failures are final: the pool's
      retries (``max_retries``) have run.
    * ``map(fn, *iterables, timeout=None, chunksize=1, buffersize=None)`` is lazy and ordered:
      it keeps at most ``buffersize`` (default ``map_window``) calls in flight, pulling the
      input as results are consumed. ``chunksize`` calls run as one task.
    * ``shutdown(wait=True, cancel_futures=False)``: no new submissions; unsent calls are
      cancelled with ``cancel_futures``; ``wait`` returns once every sent call has its
      outcome and the executor's thread has ended.

    Options: ``type``, ``priority`` and ``time_limit_s`` (every call's message options, as in
    ``QueuePool.submit``), ``map_window`` (default 1,000) and ``original_errors`` (default
    True: ``result()`` raises the rebuilt exception; False: always ``RemoteTaskError``).
    Thread-safe.
    """

    def __init__(self, queue_pool: Any, *, type: str | None = None, priority: int = 0,
                 time_limit_s: float | None = None, map_window: int = MAP_WINDOW,
                 original_errors: bool = True) -> None:
        check_number("map_window", map_window, integer=True, at_least=1)
        typed = queue_pool.config.scheduler if queue_pool.router.typed else None
        limit = queue_pool.time_limit_s if time_limit_s is None else time_limit_s
        options = put_options(type, priority, None, 0.0, None, limit, typed=typed)
        self.queue_pool = queue_pool
        self.map_window = map_window
        self._driver = _Driver(queue_pool, options, bool(original_errors))
        self._finalizer = weakref.finalize(self, self._driver.stop)

    def __repr__(self) -> str:
        return f"<QueueExecutor on {self.queue_pool!r}>"

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Schedule ``fn(*args, **kwargs)``; return its future (see the class docstring)."""
        if not callable(fn):
            raise TypeError(f"submit() needs a callable, got {fn!r:.80}")
        future: Future = Future()
        self._driver.add(future, (fn, args, kwargs or None))
        return future

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int = 1, buffersize: int | None = None) -> Iterator[Any]:
        """``fn`` over the zipped ``iterables``, results in input order, lazily (see the
        class docstring). The first ``buffersize`` calls are submitted now; a result not
        there ``timeout`` seconds after this call raises :class:`TimeoutError`. Closing the
        iterator early cancels the calls not sent yet."""
        check_number("chunksize", chunksize, integer=True, at_least=1)
        window = self.map_window if buffersize is None else buffersize
        check_number("buffersize", window, integer=True, at_least=1)
        deadline = None if timeout is None else time.monotonic() + timeout
        args = zip(*iterables)
        if chunksize > 1:
            fn = ByValue(partial(_apply_chunk, fn))
            args = _chunked(args, chunksize)
        head = deque(self.submit(fn, *a) for a in itertools.islice(args, window))
        return self._ordered(head, fn, args, deadline, chunksize > 1)

    def _ordered(self, head: deque, fn: Callable[..., Any], args: Iterator[Any], deadline: float | None,
                 chunked: bool) -> Iterator[Any]:
        try:
            while head:
                future = head.popleft()
                value = future.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
                for a in itertools.islice(args, 1):  # keep the window full
                    head.append(self.submit(fn, *a))
                if chunked:
                    yield from value
                else:
                    yield value
        finally:
            for future in head:
                future.cancel()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """See the class docstring. Safe to call more than once, and from a callback."""
        self._driver.stop(cancel_futures)
        thread = self._driver.thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def cancel_unsent(self) -> int:
        """Cancel every call not sent yet (the joblib backend's abort); return how many."""
        return self._driver.cancel_unsent()

    @property
    def batching(self) -> tuple[int, int]:
        """``(sends, calls sent)`` so far: how well submissions were batched."""
        return self._driver.sends, self._driver.sent


def _chunked(args: Iterator[tuple[Any, ...]], size: int) -> Iterator[tuple[list[tuple[Any, ...]]]]:
    while True:
        chunk = list(itertools.islice(args, size))
        if not chunk:
            return
        yield (chunk,)


class Executing:
    """The mixin that gives ``QueuePool`` its :meth:`executor`."""

    def executor(self, **options: Any) -> QueueExecutor:
        """A :class:`concurrent.futures.Executor` on this pool (see
        :class:`~daskqueue.executor.QueueExecutor` for the options). Use it as a context
        manager, or call ``shutdown()``: its thread ends then."""
        return QueueExecutor(self, **options)
