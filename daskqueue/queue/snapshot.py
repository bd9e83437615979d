"""The queue core's snapshot and restore: a durable queue's recovery (``restore*``) and a
hand-off to a successor on another process (``export_state`` / ``import_state``).

A part of :class:`daskqueue.queue.core.QueueCore` (a mixin over its state): pure, no
clock, no I/O; times come in as ``now``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from daskqueue.queue.records import Chunk, Lease, Span

__all__ = ["SnapshotMixin"]


class SnapshotMixin:
    """``restore``, ``restore_dead``, ``restore_lease``, ``export_state``, ``import_state``."""

    def restore(
        self, chunk: Chunk, spans: list[tuple[int, int, int]], *, now: float, not_before: float | None = None
    ) -> None:
        """Bring back unsettled messages of ``chunk``: ``(start, stop, attempts)`` spans."""
        self._next_seq = max(self._next_seq, chunk.base_seq + chunk.count)
        chunk.enqueued = True
        for start, stop, attempts in spans:
            span = Span(chunk, start, stop, attempts)
            self._n.total_put += span.count
            if not_before is not None and not_before > now:
                self._delayed.push(span, not_before)
            else:
                self._ready.push(span)

    def restore_dead(self, seq: int, attempts: int, error: bytes, meta: Any = None, *, payload: Any = None,
                     priority: int = 0, at: float = 0.0, ordinal: int | None = None) -> None:
        """Bring back a dead letter (with its payload and meta, when they were kept).

        ``ordinal``: the one it had (a client's fetch cursor counts them); None gives it the
        next one. Letters must come back in ordinal order; later ones count on from the
        highest restored, and never from below :meth:`advance_dead`.
        """
        self._next_seq = max(self._next_seq, seq + 1)
        self._n.total_put += 1
        chunk = Chunk(seq, 1, priority, payload, meta, True, getattr(meta, "type", None), getattr(meta, "key", None))
        self._dead.restore(seq, chunk, attempts, error, at, ordinal)

    def advance_dead(self, next_ordinal: int) -> None:
        """Never give a new dead letter an ordinal below ``next_ordinal`` (a client's cursor
        may stand anywhere below it)."""
        self._dead.advance(next_ordinal)

    def advance_seq(self, next_seq: int) -> None:
        """Never hand out a sequence number below ``next_seq`` (ids are never reused)."""
        self._next_seq = max(self._next_seq, next_seq)

    def restore_lease(
        self, lease_id: int, spans: list[Span], *, deadline: float, owner: str | None, started: float
    ) -> None:
        """Bring back a live lease under its id (a queue handed over by its previous actor):
        its spans stay leased, attempts unchanged, and its holder may settle or extend it."""
        for span in spans:
            span.chunk.enqueued = True
            self._next_seq = max(self._next_seq, span.chunk.base_seq + span.chunk.count)
        types = {s.chunk.type for s in spans}
        typed = self._select.policy.typed and len(types) == 1  # a FIFO lease of mixed types is not counted
        lease = Lease(lease_id, spans, deadline, sum(s.count for s in spans), owner, started, typed,
                      types.pop() if typed else None)
        self._leases.add(lease)
        self._n.total_put += lease.count

    def rebuild_key_holders(self) -> None:
        """After a restore or an import: every key whose message is leased, or was retried
        (attempts > 0: it ran before its key's later messages), is held by that message."""
        live = [s for lease in self._leases for s in lease.spans]
        live += [s for s in self._delayed.spans() if s.attempts]
        live += [s for s in self._ready.spans() if s.attempts]
        self._holders.rebuild(live)

    def export_state(self, *, now: float) -> dict[str, Any]:
        """Everything this core holds, for a successor on another process (``import_state``):
        times are made relative to ``now``, since clocks differ between processes. Spans
        share their chunks, so pickling the result keeps each payload once."""
        next_lease_id = self._leases.take_next_id()
        n = self._n
        return {
            "next_seq": self._next_seq,
            "next_lease_id": next_lease_id,
            "ready": self._ready.spans(),
            "delayed": [(t - now, s) for t, s in self._delayed.entries()],
            "leases": [(lease.lease_id, lease.deadline - now, lease.owner, lease.started - now, lease.spans)
                       for lease in self._leases],
            "dead": [dataclasses.replace(d, at=d.at - now) for d in self.dead],
            "totals": (n.total_put, n.total_acked, n.total_retried, n.total_expired, n.total_taken_back,
                       n.total_moved, n.total_purged),
            "fences": self.fences.snapshot(),
            "dead_appended": self.dead_appended,
        }

    def import_state(self, state: dict[str, Any], *, now: float) -> None:
        """Take over what ``export_state`` gave, into this empty core, with times from ``now``."""
        if self._n.total_put or self._next_seq:
            raise ValueError("import_state needs an empty queue core")
        for span in state["ready"]:
            self._ready.push(span)
        for due_in, span in state["delayed"]:
            self._delayed.push(span, now + due_in)
        for lease_id, deadline_in, owner, started_in, spans in state["leases"]:
            self.restore_lease(lease_id, spans, deadline=now + deadline_in, owner=owner, started=now + started_in)
        self._dead.letters = [dataclasses.replace(d, at=now + d.at) for d in state["dead"]]
        self._leases.continue_from(state["next_lease_id"])
        n = self._n
        (n.total_put, n.total_acked, n.total_retried, n.total_expired, n.total_taken_back,
         n.total_moved, n.total_purged) = state["totals"]
        self.fences.load(state["fences"] if "fences" in state else state["fenced"])
        self._dead.advance(state["dead_appended"])
        self._next_seq = state["next_seq"]
        self.rebuild_key_holders()
