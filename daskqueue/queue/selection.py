"""Which ready messages a lease takes: plain FIFO, one at a time per key, or by type.

Pure, not thread-safe: parts of one queue core (``daskqueue.queue.core``).

* **Keys.** Keyed messages run one at a time per key, in put order: a key is held by the seq
  of its message in flight (leased, or failed and waiting for its retry) until that one is
  acked, dead-lettered or released; the key's later messages wait. A fenced key
  (:class:`~daskqueue.queue.fences.Fences`) waits too.
* **Types.** Under a typed policy (``daskqueue.queue.policy``) a lease holds one type, the
  first within ``max_scan`` runs whose type is under its pool-wide limit.
"""

from __future__ import annotations

from typing import Callable, Iterable

from daskqueue.queue.fences import Fences
from daskqueue.queue.policy import TypePolicy
from daskqueue.queue.ready import ReadyQueues
from daskqueue.queue.records import Span

__all__ = ["KeyHolders", "RunningTypes", "Selector"]


class KeyHolders:
    """``key -> seq`` of the message that holds it."""

    def __init__(self) -> None:
        self._holder: dict[str, int] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._holder

    def holds(self, span: Span) -> bool:
        """Whether ``span``'s first message holds its key (it ran, or runs, before the rest)."""
        key = span.chunk.key
        return key is not None and self._holder.get(key) == span.first_seq

    def free(self, span: Span, fences: Fences) -> bool:
        """Whether ``span``'s first message may be leased as far as its key goes."""
        key = span.chunk.key
        if key is None:
            return True
        if key in fences:
            return False
        holder = self._holder.get(key)
        return holder is None or holder == span.first_seq

    def hold(self, span: Span) -> None:
        self._holder[span.chunk.key] = span.first_seq  # type: ignore[index]

    def unhold(self, span: Span) -> None:
        """``span``'s message is settled (acked, dead) or released: its key is free."""
        key = span.chunk.key
        if key is not None and self._holder.get(key) == span.first_seq:
            del self._holder[key]

    def rebuild(self, live: Iterable[Span]) -> None:
        """Each key is held by the earliest of the ``live`` spans (leased, or retried) of it."""
        self._holder = {}
        for span in live:
            key = span.chunk.key
            if key is not None and (key not in self._holder or span.first_seq < self._holder[key]):
                self._holder[key] = span.first_seq


class RunningTypes:
    """Running batches (typed leases) per type in this queue."""

    def __init__(self) -> None:
        self._running: dict[str | None, int] = {}

    def get(self, t: str | None) -> int:
        return self._running.get(t, 0)

    def as_dict(self) -> dict[str | None, int]:
        return dict(self._running)

    def started(self, t: str | None) -> None:
        self._running[t] = self._running.get(t, 0) + 1

    def ended(self, t: str | None) -> None:
        left = self._running[t] - 1
        if left:
            self._running[t] = left
        else:
            del self._running[t]


class Selector:
    """Takes the spans of one lease out of ``ready``: see the module docstring."""

    def __init__(self, ready: ReadyQueues, holders: KeyHolders, fences: Fences, running: RunningTypes,
                 policy: TypePolicy) -> None:
        self._ready = ready
        self._holders = holders
        self._fences = fences
        self._running = running
        self.policy = policy

    def take(self, max_items: int, min_priority: int | None, *, sizes: dict[str | None, int] | None,
             peer_ready: dict[str | None, int], peer_running: dict[str | None, int],
             slots: int) -> tuple[list[Span], str | None, bool]:
        """The spans of the next lease (maybe none), their type, and whether it is typed
        (counted in its type's running batches)."""
        if self.policy.typed:
            pick = self._pick_type(min_priority, peer_ready, peer_running, slots)
            if pick is None:
                return [], None, False
            prio, t = pick
            if sizes:
                max_items = max(1, sizes.get(t, max_items))
            return self._take_from(prio, max_items, lambda span: span.chunk.type == t), t, True
        if self._ready.keyed:
            spans: list[Span] = []
            for prio in self._ready.priorities():
                want = max_items - sum(s.count for s in spans)
                if not want or (min_priority is not None and prio < min_priority):
                    break
                spans += self._take_from(prio, want, lambda span: True, spans)
            return spans, None, False
        return self._ready.take_fifo(max_items, min_priority), None, False

    def _take_from(self, prio: int, want: int, wanted: Callable[[Span], bool],
                   before: list[Span] = ()) -> list[Span]:  # type: ignore[assignment]
        """Up to ``want`` messages of priority ``prio`` whose span is ``wanted`` and whose key
        is free, one per key (none of a key in ``before``), in order, within ``max_scan``
        runs; the runs skipped keep their places. Their keys are held from now."""
        taken_keys = {s.chunk.key for s in before if s.chunk.key is not None}
        left = [want]

        def pick(span: Span) -> int:
            if not left[0]:
                return -1
            key = span.chunk.key
            if not wanted(span) or not self._holders.free(span, self._fences) or key in taken_keys:
                return 0
            n = min(span.count, left[0] if key is None else 1)
            if key is not None:
                taken_keys.add(key)
            left[0] -= n
            return n

        spans = self._ready.take_scan(prio, self.policy.max_scan, pick)
        for span in spans:
            if span.chunk.key is not None:
                self._holders.hold(span)
        return spans

    def _pick_type(self, min_priority: int | None, peer_ready: dict[str | None, int],
                   peer_running: dict[str | None, int], slots: int) -> tuple[int, str | None] | None:
        """Of the highest priority, the first run (within ``max_scan``) whose type is under
        its pool-wide limit; if none is, the first whose type is under its hard cap (a fair
        share is soft, a cap is not). ``(priority, type)``, or None."""
        policy = self.policy
        ready = self._ready.by_type
        for t, n in peer_ready.items():
            ready[t] = ready.get(t, 0) + n

        def running(t: str | None) -> int:
            return self._running.get(t) + peer_running.get(t, 0)

        def under_limit(t: str | None) -> bool:
            limit = policy.limit(t, ready=ready, slots=slots)
            return limit is None or running(t) < limit

        def under_cap(t: str | None) -> bool:
            cap = policy.hard_cap(t)
            return cap is None or running(t) < cap

        fallback = None
        for prio in self._ready.priorities():
            if min_priority is not None and prio < min_priority:
                break
            for span in self._ready.runs(prio, policy.max_scan):
                t = span.chunk.type
                if not self._holders.free(span, self._fences):
                    continue
                if under_limit(t):
                    return prio, t
                if fallback is None and under_cap(t):
                    fallback = (prio, t)
        return fallback
