"""The queue core's side of moving messages to another queue (queues added to or removed
from a pool), and of fences: keys that moved here while an earlier message of theirs still
runs in the queue they came from.

A part of :class:`daskqueue.queue.core.QueueCore` (a mixin over its state): pure, no
clock, no I/O. The actor shell sends the messages and checks the fences' sources.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from daskqueue.queue.fences import ANY_SOURCE
from daskqueue.queue.records import MOVER, JournalEntry, Lease, Span, Transition

__all__ = ["CoreMovingMixin"]


class CoreMovingMixin:
    """``take_moving`` / ``return_moved`` / ``drop_moved``, fences and key queries."""

    # -- fences: the old per-key API (any source) and the by-source one -------------------

    def fence(self, keys: Iterable[str]) -> None:
        """Hold ``keys`` here until :meth:`unfence`: an earlier message of each still runs
        in the queue they moved from (which one unsaid: see :meth:`fence_from`)."""
        self.fences.add(ANY_SOURCE, keys)

    def unfence(self, keys: Iterable[str]) -> None:
        """No queue ``keys`` moved from holds any of their messages any more."""
        self.fences.release_everywhere(keys)

    @property
    def fenced(self) -> set[str]:
        """Every fenced key."""
        return self.fences.keys()

    def fence_from(self, source: int, keys: Iterable[str]) -> None:
        """Hold ``keys`` here until queue ``source`` holds none of their messages."""
        self.fences.add(source, keys)

    def unfence_from(self, source: int, keys: Iterable[str]) -> None:
        """Queue ``source`` holds none of ``keys`` any more."""
        self.fences.release(source, keys)

    # -- which keys are here ----------------------------------------------------------------

    def holds(self, span: Span) -> bool:
        """Whether ``span``'s first message holds its key (it ran, or runs, before the rest)."""
        return self._holders.holds(span)

    def keys_present(self, keys: set[str]) -> set[str]:
        """Those of ``keys`` that a message here still has (held, waiting or leased)."""
        present = {k for k in keys if k in self._holders or k in self.fences}
        for span, _ in self.live_spans():
            if span.chunk.key in keys:
                present.add(span.chunk.key)
        return present

    # -- moving -----------------------------------------------------------------------------

    def take_moving(self, dest: Callable[[Any], int | None], *, now: float,
                    key_dest: Callable[[str], int | None] | None = None,
                    ) -> tuple[dict[int, Lease], dict[int, list[float]], dict[int, set[str]]]:
        """Lease to :data:`MOVER` every waiting (ready or delayed) message whose chunk
        ``dest(chunk)`` sends to another queue (an int; None: it stays), but a message that
        holds its key: that one runs here first, and its key is fenced at its new queue.

        Returns, per destination, the lease (its spans in put order; none if nothing moves
        there), the seconds until each span is due (0: ready), and the keys that the
        destination must fence: every key it gets that a message here still has (running,
        waiting for its retry, moving already) or that is fenced here, whether or not any
        message of it moves now (a key whose one message runs here moves nothing, but its
        next put goes to the destination). ``key_dest(key)``, if given, is where ``key``
        goes: a key fenced here with no message here is fenced there too. Each lease is then
        :meth:`drop_moved` once the destination stored its messages, or
        :meth:`return_moved` if it did not.
        """
        taken: dict[int, list[tuple[Span, float]]] = {}
        for span, d in self._ready.extract(lambda span: None if self.holds(span) else dest(span.chunk)):
            taken.setdefault(d, []).append((span, 0.0))
        for span, not_before, d in self._delayed.extract(lambda span: None if self.holds(span) else dest(span.chunk)):
            taken.setdefault(d, []).append((span, max(0.0, not_before - now)))
        leases, delays, fences = {}, {}, {}
        for d, spans in taken.items():
            spans.sort(key=lambda sd: sd[0].first_seq)
            for span, _ in spans:
                self._log(JournalEntry(Transition.LEASE, span))
            lease = leases[d] = self._make_lease([s for s, _ in spans], now, MOVER)
            # A mover lease never expires (its heap entry goes stale): its messages must not be
            # redelivered here while the destination may be storing them.
            lease.deadline = math.inf
            delays[d] = [delay for _, delay in spans]
            # A key fenced here (it moved here while it ran elsewhere) is fenced there too.
            fences[d] = {s.chunk.key for s, _ in spans if s.chunk.key in self.fences}
        moving = {lease.lease_id for lease in leases.values()}
        for d, key in self._keys_staying(dest, moving, key_dest):
            fences.setdefault(d, set()).add(key)
        return leases, delays, fences

    def _keys_staying(self, dest: Callable[[Any], int | None], moving: set[int],
                      key_dest: Callable[[str], int | None] | None) -> Iterable[tuple[int, str]]:
        """``(destination, key)`` of each key that goes elsewhere while a message of it stays
        here (the leases ``moving`` left: their messages are on their way), or that is fenced
        here: the destination must not run the key's next message before those end."""
        staying = [s for lease in self._leases if lease.lease_id not in moving for s in lease.spans]
        staying += self._delayed.spans()  # what stays of them holds its key, or goes nowhere
        staying += [s for s in self._ready.spans() if s.chunk.key is not None and self.holds(s)]
        for span in staying:
            if span.chunk.key is not None:
                d = key_dest(span.chunk.key) if key_dest is not None else dest(span.chunk)
                if d is not None:
                    yield d, span.chunk.key
        if key_dest is not None:
            for key in self.fences.keys():
                d = key_dest(key)
                if d is not None:
                    yield d, key

    def return_moved(self, lease_id: int, delays: list[float], *, now: float) -> None:
        """A move failed: the messages of mover lease ``lease_id`` stay here, each span back
        where it was, ready (at the front) or delayed for the ``delays`` it had left."""
        lease = self._leases.pop(lease_id)
        for span, delay in reversed(list(zip(lease.spans, delays))):
            if delay > 0:
                self._delayed.push(span, now + delay)
                self._log(JournalEntry(Transition.RETRY, span, time=now + delay))
            else:
                self._ready.push(span, front=True)
                self._log(JournalEntry(Transition.RELEASE, span))

    def drop_moved(self, lease_id: int) -> int:
        """The messages of mover lease ``lease_id`` are stored in their new queue: they
        leave this one, with no outcome here (journalled as acks). Returns how many."""
        lease = self._leases.pop(lease_id)
        self._n.total_moved += lease.count
        for span in lease.spans:
            self._log(JournalEntry(Transition.ACK, span))
        return lease.count
