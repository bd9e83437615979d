"""Streams of any length: ``QueuePool.imap`` and ``QueuePool.imap_unordered``.

A mixin of the facade, made of ``map``'s parts: each chunk of the input is encoded and sent
as a map is (:meth:`Submitting._encode_map` / :meth:`Submitting._send_map`), its outcomes
land in a claim (a :class:`~daskqueue.results.MapClaim` that also notes what arrived), and
the pool's ``outcomes`` fetch them. What a stream adds is the window: the input is pulled a
chunk at a time, and a chunk is put only while the tasks put and not yet yielded, plus the
chunk, fit in ``window`` (in arrival order, every task of a chunk not yet wholly yielded
counts). So the client holds at most ``window`` results (and one chunk of input), whatever
the input's length. A chunk's puts are made on a thread of the stream's own (in order), so the
client goes on yielding while they travel. The window and its chunks are a pure state of
their own (:mod:`daskqueue.queue.stream_window`); this mixin sends, waits and drops.

A stream closed early (``break``, an exception in the loop, a raised task error) pulls
nothing more and puts nothing more. Tasks already put still run (a queue does not take back
a message); their outcomes are discarded as they arrive, not filed with ``results()``: the
collector releases each chunk once every outcome that can still come has come (a chunk whose
put failed part-way counts its unstored positions as arrived). A stream that ends because a
transient queue was lost (:class:`QueueLostError`) releases its chunks at once: the lost
queue's outcomes never come, and every poll of the whole pool raises from then on.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Iterator, Literal

from daskqueue import defaults
from daskqueue.errors import DaskQueueError, JoinTimeoutError, NoConsumersError, QueueCallTimeoutError, RemoteTaskError
from daskqueue.queue.call_checks import check_map_call, require_consumers
from daskqueue.queue.encode import LazyBatches
from daskqueue.queue.options import Eta
from daskqueue.queue.router import waves
from daskqueue.queue.stream_parts import (Results, Sends, is_lost, raise_in_input, runs_to_raise,
                                          unstored_positions)
from daskqueue.queue.stream_window import StreamClaim, StreamWindow
from daskqueue.serialize import pickle_function
from daskqueue.validate import check_number

__all__ = ["Streaming", "StreamClaim", "default_window"]

#: The window's state under its old name here (tests import it from this module).
_Stream = StreamWindow

logger = logging.getLogger("daskqueue")

#: Put rounds (one put batch per queue each) a default window holds: enough that the
#: consumers always find the next rounds queued while the client yields the one before, even
#: when the client gets little CPU (on a loaded 2-core machine, 4 rounds let the consumers
#: run dry now and then: imap measured 0.48-1.2x map's throughput; 8: 0.78-1.0x).
WINDOW_ROUNDS = 8

#: Put rounds a chunk holds (at most a quarter of the window): each chunk costs the client a
#: put's round trip and a wait for its first outcomes, so fewer, larger ones keep it yielding.
CHUNK_ROUNDS = 2

#: The longest a wait holds one fetch of outcomes (a long poll), between its checks.
_WAIT_SLICE_S = defaults.POLL_INTERVAL_S
#: The wait of a stream's poll while a send holds some of the queues polled, not all (see
#: ``StreamingMixin._wait``): how late outcomes filed as the send ends may be seen.
_SENDING_SLICE_S = 0.005


def default_window(put_batch_size: int, n_queues: int) -> int:
    """The default window: ``WINDOW_ROUNDS`` rounds of full put batches over the queues."""
    return WINDOW_ROUNDS * put_batch_size * max(1, n_queues)


class Streaming:
    """``imap`` and ``imap_unordered`` of a pool (see the module docstring)."""

    config: Any
    router: Any
    outcomes: Any
    collector: Any

    def imap(self, func: Callable[..., Any], iterable: Iterable[Any], **options: Any) -> Iterator[Any]:
        """Yield ``func(x)`` for each ``x`` of ``iterable``, in input order, as they arrive.

        Options (keyword-only; see :meth:`_stream` for their types and defaults): ``window``,
        ``timeout_s``, ``errors``, and :meth:`map`'s message options ``priority``, ``type``,
        ``delay_s``, ``eta``, ``key``, ``time_limit_s``.

        The input is pulled lazily, a chunk at a time, and at most ``window`` tasks are in
        flight (put and not yet yielded), so client memory is bounded by the window, not by
        the input: an endless generator works. The default window is eight rounds of full put
        batches over the queues (``8 * put_batch_size * n_queues``; 320,000 with the defaults
        and two queues): consumers find the next rounds queued while the client yields the
        one before, even when the client is short of CPU, and small results held that many
        at a time weigh a few tens of MiB. Give a smaller window for large results; chunks
        are a quarter of the window, at most two rounds.

        Errors as :meth:`map`: a task that failed on its last retry raises its
        :class:`RemoteTaskError` at its position (``errors="raise"``), or is yielded in its
        place (``errors="return"``). ``timeout_s`` bounds each wait for the next result
        (:class:`JoinTimeoutError`); if no consumer pool is started, or they all stop while
        tasks wait, :class:`NoConsumersError` is raised; a transient queue lost with its
        worker raises its :class:`QueueLostError`. The options are validated (and consumers
        checked) at the call, before the first ``next()``. An item that cannot be pickled
        (or pickles too large) raises :class:`SerializationError`
        (:class:`PayloadTooLargeError`) once its chunk is encoded, its ``index`` and message
        naming its position in ``iterable`` ("item 150,123 of the imap input"); that ends the
        stream as closing it does (below).

        Closing the iterator early (``break``, or its error) stops it: nothing more is
        pulled or put; the tasks already put run, and their outcomes are dropped. Use from
        one thread at a time, like the pool.
        """
        return self._stream(func, iterable, ordered=True, **options)

    def imap_unordered(self, func: Callable[..., Any], iterable: Iterable[Any], **options: Any) -> Iterator[Any]:
        """:meth:`imap` (the same options), but each result is yielded as soon as it arrives,
        in no set order (so a slow task holds up nothing behind it, though its chunk keeps its
        place in the window until it ends). A failed task raises (or, with
        ``errors="return"``, is yielded) when its failure arrives."""
        return self._stream(func, iterable, ordered=False, **options)

    # -- the stream -------------------------------------------------------------------------------

    def _stream(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Any],
        *,
        ordered: bool,
        window: int | None = None,
        timeout_s: float | None = None,
        errors: Literal["raise", "return"] = "raise",
        priority: int = 0,
        type: str | None = None,
        delay_s: float = 0.0,
        eta: Eta = None,
        key: Callable[[Any], str] | None = None,
        time_limit_s: float | None = None,
    ) -> Iterator[Any]:
        """The options of :meth:`imap` and :meth:`imap_unordered`, all validated now;
        return the generator that streams."""
        check_map_call(errors=errors, timeout_s=timeout_s, key=key)
        options = self._put_options(type, priority, None, delay_s, eta, time_limit_s)  # type: ignore[attr-defined]
        spread = self.router.spread(self._route(options))  # type: ignore[attr-defined]
        round_size = self.config.put_batch_size * spread
        if window is None:
            window = default_window(self.config.put_batch_size, spread)
        check_number("window", window, above=0, integer=True)
        require_consumers(self, "imap" if ordered else "imap_unordered")
        function = pickle_function(func) if key is None else None

        sends = Sends()
        source = f"{'imap' if ordered else 'imap_unordered'} input"

        def send(items: list[Any], offset: int) -> StreamClaim:
            # Lazily: each put batch is pickled while the one before travels (as map's); the
            # first now, so that an item that cannot be pickled there raises with nothing sent.
            # The encoder counts positions within the chunk: errors name them in the input.
            try:
                encoded = self._encode_map(func, items, options, key, function, lazy=True)  # type: ignore[attr-defined]
            except DaskQueueError as e:
                raise_in_input(e, offset, source)
            claim = StreamClaim(len(items))
            sends.submit(claim, lambda: self._put_chunk(encoded, claim, options, offset, source))
            return claim

        stream = StreamWindow(iterable, window, max(1, min(CHUNK_ROUNDS * round_size, window // 4)), timeout_s, errors,
                         ordered, send, self.collector.release)
        return Results.over(self._run(stream, sends))

    def _put_chunk(self, encoded: Any, claim: StreamClaim, options: Any, offset: int = 0,
                   source: str = "input") -> list[int] | None:
        """Put a chunk (on the stream's send thread); None, or the positions not stored
        when a put failed part-way (the error is then raised: :class:`~daskqueue.queue.stream_parts.Sends`).
        ``offset``: the input position of the chunk's first item (an item that cannot be
        encoded is named by its position in ``source``, the caller's input)."""
        # Ids are listed only where a wave's failure needs those of the waves before it.
        ids: list[int | None] | None = [None] * claim.n if encoded.keyed is not None else None
        try:
            self._send_chunk(encoded, claim, options, ids)
            if isinstance(encoded.batches, LazyBatches):  # a batch after the first failed to encode
                encoded.batches.raise_error()
        except BaseException as e:  # what was stored runs, unread
            unstored = unstored_positions(e, ids, encoded, claim.n)
            e.dq_unstored = unstored  # type: ignore[attr-defined]
            if isinstance(e, DaskQueueError):
                raise_in_input(e, offset, source, dq_unstored=unstored)
            raise
        return None

    def _send_chunk(self, encoded: Any, claim: StreamClaim, options: Any, ids: list[int | None] | None) -> None:
        """Send a chunk as ``map`` sends its messages (outcomes routed to ``claim``); keyed,
        noting each stored message's id in ``ids`` (None where its put failed)."""
        sender = self.sender  # type: ignore[attr-defined]
        if encoded.keyed is not None:
            for wave in waves(encoded.keyed):
                sender.send([b for _, b in wave], claim=claim, queues=[q for q, _ in wave], into=ids)
        else:
            sender.send(encoded.batches, n=claim.n, claim=claim, queue=self._route(options))  # type: ignore[attr-defined]

    def _run(self, stream: StreamWindow, sends: "Sends") -> Iterator[Iterator[Any]]:
        """The stream's outcomes as iterators over slices of them, in yield order (each
        yielded only once the one before is exhausted: :class:`~daskqueue.queue.stream_parts.Results`); a task error to
        raise is raised in place of the slice that would start at its position."""
        lost = False
        try:
            while True:
                sends.check()
                stream.fill()
                if not stream.chunks:
                    return
                if not stream.has_ready():
                    self._wait(stream, sends)
                    continue
                for chunk, start, end in stream.ready():
                    if not chunk.failures:  # the usual case: one slice, not a step per item
                        values = chunk.values
                        # A whole chunk is not copied: its list is only rebound afterwards
                        # (released, dropped), and each slice is read to its end before the
                        # next is asked for (Results), so nothing forgets values under it.
                        yield iter(values) if start == 0 and end == len(values) else iter(values[start:end])
                        continue
                    for run in runs_to_raise(chunk, start, end, stream.errors == "raise"):
                        if isinstance(run, RemoteTaskError):
                            raise run
                        yield iter(run)
        except BaseException as e:
            lost = is_lost(e)
            raise
        finally:
            lost = sends.stop() or lost
            self._drop(stream.chunks, lost=lost)

    def _wait(self, stream: StreamWindow, sends: "Sends") -> None:
        """Fetch outcomes until one may be yielded; raise :class:`JoinTimeoutError` after the
        stream's ``timeout_s`` and :class:`NoConsumersError` if no consumer runs."""
        timeout_s = stream.timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not stream.has_ready():
                sends.check()
                # While a chunk is being put, what a poll fetches from the queues it puts to
                # is held until that send ends (Sends.wait_under_way). If it holds every
                # queue: fetched without a wait, then the send is waited for (a long poll
                # would wait past the moment it is filed). If it holds some (a stream routed
                # by ``queue=``/``key=``): short slices of a long poll, so that outcomes at the
                # queues it does not hold are seen as they come, and those held soon after
                # the send ends (waiting on the send hid the others' for up to a slice).
                sending = sends.under_way()
                held = sending and self.collector.holds_all()  # type: ignore[attr-defined]
                wait_s = 0.0 if held else _SENDING_SLICE_S if sending else _WAIT_SLICE_S
                arrived = self.outcomes.poll(wait_s=wait_s, deadline=deadline, first=True)
                if stream.has_ready():
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise JoinTimeoutError(timeout_s or 0.0, {"in_flight": stream.put - stream.yielded,
                                                              "yielded": stream.yielded})
                if held:
                    left = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - time.monotonic())
                    sends.wait_under_way(left)
                if arrived == 0:  # during a send too: consumers stopped meanwhile are noticed
                    self.check_scheduler()  # type: ignore[attr-defined]
                    if not self.has_running_consumers():  # type: ignore[attr-defined]
                        self._no_consumers(stream, deadline)
        except QueueCallTimeoutError as e:
            if deadline is None:
                raise
            raise JoinTimeoutError(timeout_s or 0.0, {"unanswered_queue": e.queue_index}) from e

    def _no_consumers(self, stream: StreamWindow, deadline: float | None) -> None:
        """Raise :class:`NoConsumersError` if the stream's tasks wait in the queues with no
        consumer started (outcomes that arrived meanwhile are fetched first), as ``map``."""
        grace = None if deadline is None else deadline + defaults.CALL_GRACE_S
        pending = sum(s.pending for s in self.outcomes.stats(grace))
        self.outcomes.poll(deadline=deadline)
        if pending and not stream.has_ready() and not self.has_running_consumers():  # type: ignore[attr-defined]
            raise NoConsumersError(f"imap() stopped with {stream.put - stream.yielded:,} tasks in flight "
                                   f"({stream.yielded:,} yielded): no consumer pool of the queue pool is "
                                   "started (stopped or closed meanwhile)")

    # -- chunks of closed streams ---------------------------------------------------------------

    def _drop(self, chunks: list[StreamClaim], *, lost: bool = False) -> None:
        """A stream ended: its chunks keep no values, and the collector releases each once
        all its outcomes arrived (they stay registered until then, so that those outcomes
        are dropped on arrival instead of filed with ``results()``). ``lost``: the stream
        ended with a transient queue lost, whose outcomes never come: released now."""
        for chunk in chunks:
            chunk.drop()
        if not chunks:
            return
        logger.debug("a stream closed with %d chunks in flight: their outcomes are dropped", len(chunks))
        if lost:
            for chunk in chunks:
                self.collector.release(chunk)
        else:
            self.collector.release_when_complete(list(chunks))
