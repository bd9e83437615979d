"""The waiting messages of a queue core: ``ReadyQueues`` (ready, by priority, with their
counts) and ``DelayedSpans`` (waiting for a not-before time).

Pure and not thread-safe, like the core that owns one. Every way a span enters or leaves
the ready state goes through here, so the counts (all ready, keyed, per type) can never
disagree with the spans.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Any, Callable, Iterator

from daskqueue.queue.records import Span

__all__ = ["ReadyQueues", "DelayedSpans"]


class ReadyQueues:
    """Spans ready to run: FIFO within a priority, higher priorities first.

    ``typed``: keep the per-type count of ready messages (what a typed policy schedules by);
    off under FIFO, where nobody reads it.
    """

    def __init__(self, *, typed: bool = False) -> None:
        self._typed = typed
        self._queues: dict[int, deque[Span]] = {}  # priority -> spans
        self._priorities: list[int] = []  # keys of _queues, highest first
        self._count = 0
        self._keyed = 0
        self._by_type: dict[str | None, int] = {}

    # -- counts -------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Ready messages."""
        return self._count

    @property
    def keyed(self) -> int:
        """Ready messages with a routing key."""
        return self._keyed

    @property
    def by_type(self) -> dict[str | None, int]:
        """Ready messages per type (typed only; a copy)."""
        return dict(self._by_type)

    def of_type(self, t: str | None) -> int:
        return self._by_type.get(t, 0)

    @property
    def top_priority(self) -> int | None:
        """The highest priority with a ready message, None when none is ready."""
        return self._priorities[0] if self._count else None

    def priorities(self) -> list[int]:
        """The priorities with ready messages, highest first (a copy)."""
        return list(self._priorities)

    def runs(self, prio: int, limit: int) -> Iterator[Span]:
        """The first ``limit`` spans of priority ``prio``, in order (read only)."""
        return itertools.islice(self._queues[prio], limit)

    def spans(self) -> list[Span]:
        """Every ready span, highest priority first, FIFO within one."""
        return [s for p in self._priorities for s in self._queues[p]]

    # -- entering -----------------------------------------------------------------------

    def push(self, span: Span, *, front: bool = False) -> None:
        """Make ``span`` ready, last in its priority (first, if ``front``: released unstarted)."""
        prio = span.chunk.priority
        dq = self._queues.get(prio)
        if dq is None:
            dq = self._queues[prio] = deque()
            self._priorities.append(prio)
            self._priorities.sort(reverse=True)
        if front:
            dq.appendleft(span)
        else:
            dq.append(span)
        self._counted(span, +1)

    # -- leaving ------------------------------------------------------------------------

    def take_fifo(self, max_items: int, min_priority: int | None) -> list[Span]:
        """Remove and return the first ``max_items`` messages, highest priority first (none
        below ``min_priority``), splitting the last span taken if need be."""
        spans: list[Span] = []
        want = max_items
        while want and self._priorities:
            prio = self._priorities[0]
            if min_priority is not None and prio < min_priority:
                break
            dq = self._queues[prio]
            while want and dq:
                span = dq.popleft()
                if span.count > want:
                    span, rest = span.split(want)
                    dq.appendleft(rest)
                spans.append(span)
                want -= span.count
                self._counted(span, -1)
            self._drop_if_empty(prio)
        return spans

    def take_scan(self, prio: int, limit: int, pick: Callable[[Span], int]) -> list[Span]:
        """Look at the first ``limit`` spans of priority ``prio`` in order; take the first
        ``pick(span)`` messages of each (0: it keeps its place). Stops early once ``pick``
        returns a negative number (nothing more wanted). Returns the spans taken, in order."""
        dq = self._queues[prio]
        kept: list[Span] = []
        taken: list[Span] = []
        for _ in range(limit):
            if not dq:
                break
            span = dq.popleft()
            n = pick(span)
            if n < 0:
                kept.append(span)
                break
            if n == 0:
                kept.append(span)
                continue
            if span.count > n:
                span, rest = span.split(n)
                kept.append(rest)
            taken.append(span)
            self._counted(span, -1)
        dq.extendleft(reversed(kept))
        self._drop_if_empty(prio)
        return taken

    def extract(self, select: Callable[[Span], Any]) -> list[tuple[Span, Any]]:
        """Remove every span for which ``select(span)`` is not None; return them with that
        value, in priority then FIFO order. The others keep their order."""
        out: list[tuple[Span, Any]] = []
        for prio in list(self._priorities):
            kept: deque[Span] = deque()
            for span in self._queues[prio]:
                value = select(span)
                if value is None:
                    kept.append(span)
                else:
                    out.append((span, value))
                    self._counted(span, -1)
            self._queues[prio] = kept
            self._drop_if_empty(prio)
        return out

    def clear(self) -> list[Span]:
        """Remove and return every ready span."""
        spans = self.spans()
        self._queues, self._priorities = {}, []
        self._count = self._keyed = 0
        self._by_type = {}
        return spans

    # -- helpers ------------------------------------------------------------------------

    def _counted(self, span: Span, sign: int) -> None:
        n = sign * span.count
        self._count += n
        if span.chunk.key is not None:
            self._keyed += n
        if self._typed:
            t = span.chunk.type
            left = self._by_type.get(t, 0) + n
            if left:
                self._by_type[t] = left
            else:
                del self._by_type[t]

    def _drop_if_empty(self, prio: int) -> None:
        if not self._queues[prio]:
            del self._queues[prio]
            self._priorities.remove(prio)

    def validate(self) -> None:
        """Check the counts against the spans; raise ``AssertionError`` naming the first that fails."""
        spans = self.spans()
        ready = sum(s.count for s in spans)
        assert ready == self._count, f"ready count {self._count} != {ready} in spans"
        assert all(self._queues[p] for p in self._priorities), "empty priority deque kept"
        assert sorted(self._queues, reverse=True) == self._priorities, "priority order broken"
        keyed = sum(s.count for s in spans if s.chunk.key is not None)
        assert keyed == self._keyed, f"keyed ready {self._keyed} != {keyed}"
        if self._typed:
            by_type: dict[str | None, int] = {}
            for s in spans:
                by_type[s.chunk.type] = by_type.get(s.chunk.type, 0) + s.count
            assert by_type == self._by_type, f"ready by type {self._by_type} != {by_type}"


class DelayedSpans:
    """Spans waiting for their not-before time (a retry's backoff, a delayed put), in a
    heap by that time; ties keep their order of arrival."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Span]] = []
        self._ticket = itertools.count()
        self._count = 0

    @property
    def count(self) -> int:
        """Delayed messages."""
        return self._count

    def push(self, span: Span, not_before: float) -> None:
        heapq.heappush(self._heap, (not_before, next(self._ticket), span))
        self._count += span.count

    def next_due(self) -> float | None:
        """The earliest not-before time, None when nothing is delayed."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> Iterator[Span]:
        """Remove and yield each span due at ``now``, earliest first."""
        while self._heap and self._heap[0][0] <= now:
            _, _, span = heapq.heappop(self._heap)
            self._count -= span.count
            yield span

    def entries(self) -> list[tuple[float, Span]]:
        """``(not_before, span)`` of every delayed span, earliest first."""
        return [(t, s) for t, _, s in sorted(self._heap, key=lambda d: d[:2])]

    def spans(self) -> list[Span]:
        return [s for _, _, s in self._heap]

    def extract(self, select: Callable[[Span], Any]) -> list[tuple[Span, float, Any]]:
        """Remove every span for which ``select(span)`` is not None; return them with their
        not-before time and that value."""
        out, kept = [], []
        for entry in self._heap:
            value = select(entry[2])
            if value is None:
                kept.append(entry)
            else:
                out.append((entry[2], entry[0], value))
                self._count -= entry[2].count
        if out:
            heapq.heapify(kept)
            self._heap = kept
        return out

    def clear(self) -> list[Span]:
        """Remove and return every delayed span."""
        spans = self.spans()
        self._heap, self._count = [], 0
        return spans

    def validate(self) -> None:
        delayed = sum(s.count for _, _, s in self._heap)
        assert delayed == self._count, f"delayed count {self._count} != {delayed} in heap"
