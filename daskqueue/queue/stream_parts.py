"""The parts of a stream (``queue/streaming.py``) that are not its window: its puts, made in
order on a thread of their own (:class:`Sends`), what ``imap`` returns (:class:`Results`,
chained in C and closed like a generator), and the outcomes of a chunk's slice as runs to
yield or errors to raise (:func:`runs_to_raise`), which positions a failed put left
unstored (:func:`unstored_positions`), and an encoding error of a chunk named by its
position in the caller's input (:func:`raise_in_input`)."""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import re
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

from daskqueue.errors import PayloadTooLargeError, QueueLostError, QueueMovedError, SerializationError
from daskqueue.queue.encode import LazyBatches

#: A ``StreamClaim`` of :mod:`daskqueue.queue.streaming` (not imported: that module imports this one).
StreamClaimLike = Any

__all__ = ["Sends", "Results", "runs_to_raise", "is_lost", "unstored_positions", "raise_in_input"]


class Sends:
    """A stream's puts, made in order on a thread of their own, so that the client yields
    (and polls) while a chunk's puts travel and their answers are awaited (a put answered
    in turn cost the yield loop a fifth of its time). A failed put is raised in the
    stream's thread by :meth:`check`; its chunk is dropped, its unstored positions counted
    as arrived (the chunk stays in the stream's list: its ``finally`` hands it to the
    collector with the others)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._futures: collections.deque[tuple[StreamClaimLike, Future[Any]]] = collections.deque()

    def submit(self, claim: StreamClaimLike, put: Callable[[], Any]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="daskqueue-stream-put")
        self._futures.append((claim, self._pool.submit(put)))

    def under_way(self) -> bool:
        """Whether a chunk's puts are being made (or wait their turn)."""
        return any(not future.done() for _, future in self._futures)

    def wait_under_way(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the chunk being put to be sent and its claims
        registered. Its send *holds* the queues it puts to: outcomes fetched meanwhile are
        kept aside, and filed (by the send's thread) only as it ends, so a poll made then
        returns nothing, and a long poll after it waits for outcomes newer still while
        those are filed (measured: three quarters of an ``imap``'s outcomes are filed so)."""
        for _, future in self._futures:
            if not future.done():
                concurrent.futures.wait([future], timeout=max(0.0, timeout_s))
                return

    def check(self) -> None:
        """Raise the error of the first put that failed, if any (puts that ended are forgotten)."""
        while self._futures and self._futures[0][1].done():
            claim, future = self._futures.popleft()
            error = future.exception()
            if error is not None:
                self._failed(claim, error)
                raise error

    def stop(self) -> bool:
        """The stream ended: puts not started never will be (their chunks count as
        arrived), the one under way is waited for. Whether a put lost its queue."""
        lost = False
        for claim, future in self._futures:
            if future.cancel():
                claim.drop()
                claim.never(list(range(claim.n)))
                continue
            error = future.exception()  # waits for it
            if error is not None:
                self._failed(claim, error)
                lost = lost or is_lost(error)
        self._futures.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        return lost

    @staticmethod
    def _failed(claim: StreamClaimLike, error: BaseException) -> None:
        claim.drop()
        claim.never(getattr(error, "dq_unstored", list(range(claim.n))))


def runs_to_raise(chunk: StreamClaimLike, start: int, end: int, raising: bool) -> Iterator[Any]:
    """The outcomes of positions ``start .. end`` of ``chunk`` as lists, and with
    ``raising`` each task error (a :class:`RemoteTaskError` the task failed with, not one it
    returned) on its own, in place, for the caller to raise."""
    run: list[Any] = []
    for p in range(start, end):
        outcome = chunk.outcome(p)
        if raising and p in chunk.failures:
            if run:
                yield run
                run = []
            yield outcome
        else:
            run.append(outcome)
    if run:
        yield run


class Results(itertools.chain):
    """What ``imap`` returns: the stream's outcomes, chained from its slices in C (a Python
    generator frame resumed per item cost the yield loop about a fifth of its time), and
    closed like a generator: :meth:`close` stops the stream (its ``finally`` drops the chunks
    in flight) and yields nothing more. A stream dropped unclosed (a ``break``) is closed by
    its generator's finalizer, as a generator would be."""

    _slices: Any
    _current: Any

    @classmethod
    def over(cls, slices: Iterator[Iterator[Any]]) -> "Results":
        holder: list[Any] = [iter(())]

        def noted() -> Iterator[Iterator[Any]]:
            for it in slices:  # kept, so that close() can empty the slice being read
                holder[0] = it
                yield it

        results = cls.from_iterable(noted())
        results._slices = slices
        results._current = holder
        return results

    def close(self) -> None:
        """Stop the stream: nothing more is pulled, put or yielded."""
        self._slices.close()
        for _ in self._current[0]:
            pass


def unstored_positions(error: BaseException, ids: list[int | None] | None, encoded: Any, n: int) -> list[int]:
    """The positions of a chunk that no queue stored, after its send raised ``error``: from
    the ids noted (a keyed chunk's), the send's ``stored_ids``, or, when a batch failed to
    encode after the others were all stored, the positions from that batch on."""
    stored = ids if ids is not None else getattr(error, "stored_ids", None)
    if stored is not None:
        return [p for p, i in enumerate(stored) if i is None]
    batches = encoded.batches
    if isinstance(batches, LazyBatches) and batches.error is error:
        return list(range(batches.encoded, n))
    return list(range(n))


def is_lost(error: BaseException) -> bool:
    """Whether ``error`` says a queue is lost for good (a durable one that moved is not:
    its outcomes still come)."""
    return isinstance(error, QueueLostError) and not isinstance(error, QueueMovedError)


def raise_in_input(error: BaseException, offset: int, source: str, **attributes: Any) -> None:
    """Raise ``error``, an error of encoding one chunk of a stream, naming its task by its
    position in the caller's input, not in the chunk (whose first item is input position
    ``offset``): a :class:`SerializationError` or :class:`PayloadTooLargeError` with an
    ``index`` is raised anew, of the same type, its ``index`` ``offset`` more, its message
    saying "item N of the <source>" where it said "task i" (the rest of the message, the
    cause and the traceback kept), with ``attributes`` set on it; any other error as it is."""
    index = getattr(error, "index", None)
    if not isinstance(error, (SerializationError, PayloadTooLargeError)) or index is None:
        raise error
    at = offset + index
    where = f"item {at:,} of the {source}"
    message, n = re.subn(rf"\btask {index}(?: of the batch)?\b", where, str(error), count=1)
    if not n:
        message = f"{message} ({where})"
    if isinstance(error, PayloadTooLargeError):
        moved: BaseException = PayloadTooLargeError(error.size, error.limit, index=at)
        moved.args = (message,)
    else:
        moved = SerializationError(message, index=at)
    for name, value in attributes.items():
        setattr(moved, name, value)
    moved.__cause__ = error.__cause__
    moved.__suppress_context__ = True
    raise moved.with_traceback(error.__traceback__)
