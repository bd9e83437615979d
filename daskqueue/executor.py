"""``QueuePool.executor()``: the pool as a :class:`concurrent.futures.Executor`.

Every tool that takes an executor instance (``executor=`` arguments, ``asyncio``'s
``run_in_executor``; joblib through :mod:`daskqueue.joblib_backend`) can run its work on a
queue pool. (``tqdm.contrib.concurrent`` takes an executor class, so not this one: wrap
``tqdm(executor.map(...))`` for a bar.)

One thread per executor (:mod:`daskqueue.executor_thread`, started by the first ``submit``)
does all the remote work, so that neither submitting nor waiting costs an actor call per
future:

* ``submit`` only appends the call to a buffer and wakes the thread; the thread takes the
  whole buffer at once and sends it as one submission (one put per queue). Submissions made
  while a send is under way (from any number of threads) ride on the next one: the batch grows
  with the rate of submission, with no timer.
* Outcomes are fetched in bulk (one ``fetch_outcomes`` call per queue per poll), and routed by
  the pool's result collector straight to the futures of each send (a *claim* on the send's
  ids, registered as each put is answered, as ``map`` does), not through ``results()``: a
  caller taking the pool's results does not take these. A send with a claim holds the
  collector (other threads' polls wait those few milliseconds), so an outcome that comes
  before its put's answer is read cannot land in the pool's results either.
  Polls back off from 1 ms to ``POLL_INTERVAL_S`` while nothing arrives, and stop while
  nothing is in flight (an idle executor makes no call).

Futures resolve on that thread, so ``add_done_callback`` callbacks run there: a slow callback
delays the other futures. A future is ``running()`` from when its call is sent: a sent call
cannot be taken back from the queues, so ``cancel()`` succeeds only before (in the buffer) and
honestly returns False after.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import cloudpickle

from daskqueue.executor_thread import Driver
from daskqueue.queue.options import put_options
from daskqueue.validate import check_number

__all__ = ["QueueExecutor", "ByValue"]

#: A ``map`` keeps at most this many calls in flight unless told otherwise.
MAP_WINDOW = 1_000


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


class QueueExecutor(Executor):
    """A :class:`concurrent.futures.Executor` running calls on a queue pool (see the module
    docstring); made by :meth:`QueuePool.executor`. Needs a started ``ConsumerPool`` on the
    pool: calls in flight while none has been started for 2 s fail with
    :class:`NoConsumersError` (as the pool's ``map`` and ``join`` raise it).

    * ``submit(fn, *args, **kwargs)`` returns a :class:`concurrent.futures.Future`. Its
      ``result()`` raises the task's own exception type when it can be rebuilt here (see
      :mod:`daskqueue.local_errors`), chained from the :class:`RemoteTaskError` that holds
      the remote traceback; else that ``RemoteTaskError``. Failures are final: the pool's
      retries (``max_retries``) have run.
    * ``map(fn, *iterables, timeout=None, chunksize=1, buffersize=None)`` is lazy and ordered:
      it keeps at most ``buffersize`` (default ``map_window``) calls in flight, pulling more
      input (in bulk, once half the window is consumed) as results are taken. ``chunksize``
      calls run as one task: per-call futures cost client CPU (about 8,000 calls/s on a
      loaded 2-core machine, against ``QueuePool.map``'s 60,000+), so many tiny calls want a
      ``chunksize`` of 100 or more.
    * A transient queue lost with its worker fails the calls it held with its
      :class:`QueueLostError`; the calls on the other queues go on and complete.
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
        self._driver = Driver(queue_pool, options, bool(original_errors))
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
        return self._ordered(head, fn, args, deadline, chunksize > 1, window)

    def _ordered(self, head: deque, fn: Callable[..., Any], args: Iterator[Any], deadline: float | None,
                 chunked: bool, window: int) -> Iterator[Any]:
        low = max(1, window // 2)
        try:
            while head:
                future = head.popleft()
                value = future.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
                if len(head) < low:  # refill in bulk: one send, not one per result
                    head.extend(self.submit(fn, *a) for a in itertools.islice(args, window - len(head)))
                if chunked:
                    yield from value
                else:
                    yield value
        finally:
            for future in head:
                future.cancel()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """See the class docstring. Safe to call more than once, and from a callback."""
        thread = self._driver.stop(cancel_futures)
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
