"""The queue core's value types: chunks, spans, leases, dead letters, journal entries, stats.

Pure data: no behaviour beyond splitting a span. See ``daskqueue.queue.core`` for the
lifecycle they take part in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

__all__ = ["Chunk", "Span", "Lease", "DeadLetter", "Transition", "JournalEntry", "Settlement", "CoreStats",
           "Counters", "LEASE_EXPIRED", "MOVER"]

#: The error recorded for a message whose lease ran out.
LEASE_EXPIRED = b"daskqueue.LeaseExpired\x00the lease expired before the message was settled\x00"


@dataclass(slots=True, eq=False)
class Chunk:
    """The messages of one put: ``count`` messages with sequence numbers from ``base_seq``.

    ``payload`` and ``meta`` are opaque to the core (the shell stores the bytes and offsets
    there); ``priority`` orders delivery, higher first.
    """

    base_seq: int
    count: int
    priority: int = 0
    payload: Any = None
    meta: Any = None
    enqueued: bool = False
    type: str | None = None  # the messages' type (what a TypePolicy schedules by)
    key: str | None = None  # the messages' routing key: one at a time per key, in put order


@dataclass(slots=True, eq=False)
class Span:
    """Messages ``start <= i < stop`` of ``chunk``, which share ``attempts``."""

    chunk: Chunk
    start: int
    stop: int
    attempts: int = 0

    @property
    def count(self) -> int:
        return self.stop - self.start

    @property
    def first_seq(self) -> int:
        return self.chunk.base_seq + self.start

    def split(self, n: int) -> tuple[Span, Span]:
        """Return the first ``n`` messages and the rest, as two new spans."""
        cut = self.start + n
        return (
            Span(self.chunk, self.start, cut, self.attempts),
            Span(self.chunk, cut, self.stop, self.attempts),
        )


@dataclass(slots=True, eq=False)
class Lease:
    """A delivery: the spans handed to one consumer, held until ``deadline``.

    ``owner`` names who holds it (a consumer's worker address) so that ``take_back`` can end
    every lease of a worker that died; None for an anonymous caller."""

    lease_id: int
    spans: list[Span]
    deadline: float
    count: int
    owner: str | None = None
    started: float = 0.0  # when it was handed out (what a queue measures task time from)
    typed: bool = False  # counted in its type's running batches (a typed policy's lease)
    type: str | None = None  # the type of every message in it, when ``typed``


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that failed more than ``max_retries`` times, with its last error: message
    ``index`` of ``chunk`` (a chunk of its own when the shell detaches payloads, so that a dead
    letter does not keep its whole put batch alive), dead-lettered at time ``at``."""

    seq: int
    chunk: Chunk
    index: int
    attempts: int
    error: bytes
    at: float = 0.0
    ordinal: int = 0  # the number of dead letters before it in this queue's life (a fetch cursor)


class Transition(Enum):
    """A step of the lifecycle that a durable shell persists (``durable.py`` maps each to
    its on-disk index record: the core knows nothing of the disk format)."""

    LEASE = "lease"  # handed to a consumer (or to the mover)
    RELEASE = "release"  # back to ready, unstarted, attempts unchanged
    ACK = "ack"  # settled with no further life here: ran, moved away, or purged
    RETRY = "retry"  # failed, due again at ``time``
    DEAD = "dead"  # dead-lettered with ``error``
    DEAD_DROP = "dead_drop"  # a dead letter removed (purged, or replayed as a new message)


class JournalEntry(NamedTuple):
    """One journalled transition of a span.

    LEASE, RELEASE and ACK carry the span; RETRY also the ``time`` it is due again; DEAD also
    the ``error`` (its span's ``attempts`` count the failed run).
    """

    kind: Transition
    span: Span
    time: float = 0.0
    error: bytes = b""


@dataclass(frozen=True, slots=True)
class Settlement:
    """What ``settle`` did: the number of messages per outcome."""

    n_acked: int
    n_retried: int
    n_dead: int
    n_released: int


@dataclass(frozen=True, slots=True)
class CoreStats:
    """Counts of messages per state, and lifetime totals."""

    ready: int
    delayed: int
    leased: int
    dead: int
    total_put: int
    total_acked: int
    total_retried: int
    total_expired: int
    total_taken_back: int
    total_moved: int = 0  # handed to another queue of the pool (add_queues / remove_queue)
    total_purged: int = 0  # dropped by purge, or dead letters replayed (as new messages)

    @property
    def pending(self) -> int:
        """Messages not yet settled: ready, delayed or leased."""
        return self.ready + self.delayed + self.leased


@dataclass(slots=True)
class Counters:
    """The core's running counts (what :class:`CoreStats` reports)."""

    total_put: int = 0
    total_acked: int = 0
    total_retried: int = 0
    total_expired: int = 0
    total_taken_back: int = 0
    total_moved: int = 0
    total_purged: int = 0  # dead letters and waiting messages dropped by purge / replayed


#: The owner of the leases that hold messages on their way to another queue.
MOVER = "daskqueue-mover"
