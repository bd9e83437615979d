"""The state of one ``imap`` stream: its window, and the chunks in it.

:class:`StreamWindow` pulls the input a chunk at a time and puts a chunk only while it fits in
the window; it says which positions' outcomes may be yielded now, in yield order, and
releases each chunk once it is wholly yielded. :class:`StreamClaim` is a chunk: a
:class:`~daskqueue.results.MapClaim` that also notes what arrived, in arrival order. Both are
pure (no Dask, no clock, no I/O): :class:`~daskqueue.queue.streaming.Streaming` gives the
window its calls out (a chunk's send, the collector's release) and waits for outcomes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from daskqueue.errors import RemoteTaskError
from daskqueue.results import MapClaim

__all__ = ["StreamClaim", "StreamWindow"]

#: Inputs a stream slices instead of iterating (exactly these types: a subclass may change
#: what slicing means).
SLICED_INPUTS = (range, list, tuple)


@dataclass(eq=False)
class StreamClaim(MapClaim):
    """A chunk of a stream: a :class:`MapClaim` that also notes, once, each position whose
    outcome arrived (``fresh`` ranges in arrival order) and how long a prefix of positions has
    arrived (``prefix``); a dropped one keeps no values. Its positions are the chunk's."""

    fresh: list[tuple[int, int]] = field(default_factory=list)
    prefix: int = 0
    dropped: bool = False
    yielded: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._arrived = bytearray(self.n)

    def succeed(self, position: int, values: list[Any]) -> None:
        if self.dropped:  # only counted, so that the collector knows when to release it
            super().succeed(position, [None] * len(values))
            return
        super().succeed(position, values)
        self._note(position, position + len(values))

    def fail(self, position: int, error: RemoteTaskError) -> None:
        super().fail(position, error)
        if self.dropped:
            self.failures.clear()
            return
        self._note(position, position + 1)

    def _note(self, start: int, end: int) -> None:
        arrived = self._arrived
        if not arrived.count(1, start, end):
            self.fresh.append((start, end))
        else:  # an outcome delivered twice (at least once delivery): the new ones only
            self.fresh.extend((p, p + 1) for p in range(start, end) if not arrived[p])
        arrived[start:end] = b"\x01" * (end - start)
        if start <= self.prefix:
            found = arrived.find(0, self.prefix)
            self.prefix = self.n if found < 0 else found

    def drop(self) -> None:
        """Nobody reads this chunk any more: forget its values, and those still to come."""
        self.dropped = True
        self.values = [None] * self.n
        self.failures.clear()
        self.fresh.clear()

    def never(self, positions: list[int]) -> None:
        """These positions have no outcome to come (their put was not stored): a dropped
        chunk counts them as arrived, so that it completes with the others."""
        assert self.dropped, "only a dropped chunk stops waiting for positions"
        for p in positions:
            self.succeed(p, [None])

    def forget(self, start: int, end: int) -> None:
        """Positions ``start .. end`` were yielded: keep their values no longer."""
        self.values[start:end] = [None] * (end - start)
        if self.failures:
            for p in range(start, end):
                self.failures.pop(p, None)

    def outcome(self, position: int) -> Any:
        """The value or :class:`RemoteTaskError` of an arrived position."""
        error = self.failures.get(position)
        return self.values[position] if error is None else error


@dataclass
class StreamWindow:
    """The state of one stream: its input, window, chunks in input order, counters. Pure:
    ``send`` and ``release`` are the stream's calls out (put a chunk; let a chunk go)."""

    items: Iterable[Any]  # the input (see ``__post_init__``)
    window: int
    chunk: int
    timeout_s: float | None
    errors: str
    ordered: bool
    send: Callable[[list[Any], int], StreamClaim]  # (a chunk's items, its first one's input position)
    release: Callable[[StreamClaim], None]
    chunks: list[StreamClaim] = field(default_factory=list)
    put: int = 0
    yielded: int = 0
    exhausted: bool = False

    def in_flight(self) -> int:
        """What the window counts. In input order: tasks put and not yet yielded (the chunks
        before the head are released, the head's yielded prefix is at most a chunk). In
        arrival order a chunk is released only once all its positions are yielded, so one
        slow task keeps its whole chunk: every position of an unreleased chunk counts, else
        a slow task per chunk would let ``window x chunk`` values be held."""
        if self.ordered:
            return self.put - self.yielded
        return sum(c.n for c in self.chunks)

    def __post_init__(self) -> None:
        # A ``range``, list or tuple input is sliced (a range's slice is a range: nothing is
        # built per item here); any other is pulled item by item.
        self._sliced = type(self.items) in SLICED_INPUTS
        if not self._sliced:
            self.items = iter(self.items)

    def fill(self) -> None:
        """Put chunks while they fit in the window and the input lasts."""
        while not self.exhausted and self.window - self.in_flight() >= self.chunk:
            if self._sliced:
                items = self.items[self.put : self.put + self.chunk]  # type: ignore[index]
            else:
                items = list(itertools.islice(self.items, self.chunk))
            if len(items) < self.chunk:
                self.exhausted = True
            if items:
                self.chunks.append(self.send(items, self.put))
                self.put += len(items)

    def ready(self) -> Iterator[tuple[StreamClaim, int, int]]:
        """``(chunk, start, end)``: ranges of positions whose outcomes may be yielded now, in
        yield order, counted as yielded (the caller yields each whole range before it asks for
        the next: nothing is put meanwhile, fill() runs between ranges only, so the window
        holds); at most one chunk's, so that the window is filled again as each chunk ends. In arrival order a range's values are forgotten once the caller asks for the
        next, so a chunk waiting on a slow task holds only what was not yet yielded."""
        if self.ordered:
            if not self.chunks:
                return
            head = self.chunks[0]
            if head.prefix > head.yielded:
                start, end = head.yielded, head.prefix
                self._count(head, start, end)
                yield head, start, end
            if head.yielded == head.n:
                # The window has a chunk's room now: the caller fills it before the next
                # chunk's outcomes are yielded (a run of arrived chunks was yielded whole, a
                # few hundred thousand items, while the queues ran dry).
                self.release(self.chunks.pop(0))
            return
        for c in list(self.chunks):
            fresh, c.fresh = c.fresh, []
            for start, end in fresh:
                self._count(c, start, end)
                yield c, start, end
                c.forget(start, end)
            if c.yielded == c.n:
                self.chunks.remove(c)
                self.release(c)
                return  # room in the window: filled before the next chunk's outcomes

    def _count(self, chunk: StreamClaim, start: int, end: int) -> None:
        chunk.yielded += end - start
        self.yielded += end - start

    def has_ready(self) -> bool:
        if self.ordered:
            return bool(self.chunks) and self.chunks[0].prefix > self.chunks[0].yielded
        return any(c.fresh for c in self.chunks)
