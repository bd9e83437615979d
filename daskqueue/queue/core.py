"""The queue core: a pure state machine for the message lifecycle.

No Dask, no clock reads, no I/O: every method that depends on time takes ``now`` (seconds,
monotonic: the shell converts the persisted wall-clock times at its boundary), and
randomness (backoff jitter) comes from a seeded ``random.Random``. Actor shells
(``TransientQueue``, ``DurableQueue``) add the clock, the timers, the waiters and storage
around one instance.

Lifecycle of a message::

    put -> READY --get_batch--> LEASED(deadline) --settle(done)--> ACKED
                                  |  settle(error) / lease expired: attempts += 1
                                  v
                 DELAYED(not_before = now + backoff) --due--> READY
                 ...or DEAD (dead-letter list, with its last error) once attempts > max_retries
           LEASED --settle(released: fetched, never started)--> READY (front, attempts unchanged)

Messages are kept in **spans**: a run of consecutive messages of one put batch (a *chunk*).
A put of 10,000 messages is one span; ``get_batch`` splits spans, so the per-message cost on
the hot path is zero and memory per waiting message is its payload plus a 4-byte offset.

The parts: value types in ``records``, the ready queues in ``ready``, which messages a lease
takes in ``selection``, leases in ``leases``, dead letters in ``dead``, moving and fences in
``core_moving`` and ``fences``, snapshot and restore in ``snapshot``, the views of the state and
``validate()`` (its invariants) in ``core_inspection``; this module holds the lifecycle itself.

Not thread-safe: the owner (an actor on one event loop) serialises calls.
"""

from __future__ import annotations

import random
from typing import Any

from daskqueue.queue.backoff import compute_backoff
from daskqueue.queue.dead import DeadLetters
from daskqueue.queue.fences import Fences
from daskqueue.queue.leases import LeaseTable
from daskqueue.queue.core_inspection import InspectionMixin
from daskqueue.queue.core_moving import CoreMovingMixin
from daskqueue.queue.policy import FIFO, TypePolicy
from daskqueue.queue.ready import DelayedSpans, ReadyQueues
from daskqueue.queue.records import (
    LEASE_EXPIRED,
    MOVER,
    Chunk,
    CoreStats,
    Counters,
    DeadLetter,
    JournalEntry,
    Lease,
    Settlement,
    Span,
    Transition,
)
from daskqueue.queue.selection import KeyHolders, RunningTypes, Selector
from daskqueue.queue.settling import check_settlement, divide
from daskqueue.queue.snapshot import SnapshotMixin

# Re-exported: other modules import these names from here.
__all__ = ["Chunk", "Span", "Lease", "DeadLetter", "JournalEntry", "Transition", "QueueCore", "CoreStats",
           "Settlement", "LEASE_EXPIRED", "MOVER"]


class QueueCore(CoreMovingMixin, SnapshotMixin, InspectionMixin):
    """The lifecycle of the messages of one queue (see the module docstring).

    Parameters (keyword-only): ``lease_timeout_s`` (> 0), ``max_retries`` (>= 0), the backoff
    ``retry_backoff_base_s`` / ``retry_backoff_max_s`` / ``retry_backoff_jitter``, ``seed``
    for the jitter's random generator, and ``lease_id_base``: lease ids count up from it, so
    that two incarnations of one queue (a durable queue reopened elsewhere) never hand out
    the same id, and a consumer's settlement for the old one cannot settle a new lease.
    """

    def __init__(
        self,
        *,
        lease_timeout_s: float,
        max_retries: int,
        retry_backoff_base_s: float = 0.05,
        retry_backoff_max_s: float = 30.0,
        retry_backoff_jitter: float = 0.5,
        seed: int | None = None,
        lease_id_base: int = 0,
        policy: TypePolicy = FIFO,
    ) -> None:
        if not lease_timeout_s > 0:
            raise ValueError(f"lease_timeout_s must be > 0, got {lease_timeout_s!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        if retry_backoff_base_s < 0 or retry_backoff_max_s < 0:
            raise ValueError(
                f"retry backoff must be >= 0, got base {retry_backoff_base_s!r} max {retry_backoff_max_s!r}"
            )
        if not 0 <= retry_backoff_jitter <= 1:
            raise ValueError(f"retry_backoff_jitter must be in [0, 1], got {retry_backoff_jitter!r}")
        self.lease_timeout_s = lease_timeout_s
        self.max_retries = max_retries
        self._backoff = (retry_backoff_base_s, retry_backoff_max_s, retry_backoff_jitter)
        self._rng = random.Random(seed)
        self._next_seq = 0
        self._ready = ReadyQueues(typed=policy.typed)
        self._delayed = DelayedSpans()
        self._dead = DeadLetters()
        self._n = Counters()
        #: When a list, every transition is appended to it as a :class:`JournalEntry`, in
        #: order, for a durable shell to persist; None (the default) records nothing.
        self.journal: list[JournalEntry] | None = None
        #: Keys that moved here while an earlier message of theirs ran in the queue they
        #: came from, by that queue: none of theirs runs here until released (``moving``).
        self.fences = Fences()
        self._holders = KeyHolders()
        self._running = RunningTypes()
        self._leases = LeaseTable(self._running, id_base=lease_id_base)
        self._select = Selector(self._ready, self._holders, self.fences, self._running, policy)
        #: The pool's running slots (consumers x max_concurrency), told by the shell.
        self.slots = 0
        #: Ready messages and running batches per type in the pool's other queues (the
        #: shell keeps them from its peers' reports); added to this queue's own counts.
        self.peer_ready: dict[str | None, int] = {}
        self.peer_running: dict[str | None, int] = {}
        #: ``detach(chunk, i)``: the payload of message ``i`` of ``chunk`` alone, for its dead
        #: letter (set by the shell; None keeps the whole chunk's payload).
        self.detach: Any = None

    @property
    def dead(self) -> list[DeadLetter]:
        """The dead letters, oldest (lowest ordinal) first; read only."""
        return self._dead.letters

    @property
    def dead_appended(self) -> int:
        """The next dead letter's ordinal: what a client's cursor over them counts, since
        ``take_dead`` may remove any of them."""
        return self._dead.appended

    @property
    def policy(self) -> TypePolicy:
        return self._select.policy

    def _log(self, entry: JournalEntry) -> None:
        if self.journal is not None:
            self.journal.append(entry)

    # -- put ------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The sequence number the next put message will get."""
        return self._next_seq

    def new_chunk(self, count: int, *, priority: int = 0, payload: Any = None, meta: Any = None,
                  type: str | None = None, key: str | None = None) -> Chunk:
        """Allocate ``count`` sequence numbers for a put (call ``put`` with the chunk next)."""
        if count <= 0:
            raise ValueError(f"a chunk holds at least one message, got count={count}")
        chunk = Chunk(self._next_seq, count, priority, payload, meta, type=type, key=key)
        self._next_seq += count
        return chunk

    def put(self, chunk: Chunk, *, now: float, not_before: float | None = None) -> None:
        """Make every message of ``chunk`` ready (or delayed until ``not_before``)."""
        if chunk.base_seq + chunk.count > self._next_seq:
            raise ValueError("chunk was not allocated by new_chunk")
        if chunk.enqueued:
            raise ValueError(f"chunk at seq {chunk.base_seq} was put already")
        chunk.enqueued = True
        self._n.total_put += chunk.count
        span = Span(chunk, 0, chunk.count, 0)
        if not_before is not None and not_before > now:
            self._delayed.push(span, not_before)
        else:
            self._ready.push(span)

    # -- get ------------------------------------------------------------------------------

    @property
    def top_priority(self) -> int | None:
        """The highest priority among ready messages (None when none is ready)."""
        return self._ready.top_priority

    @property
    def keyed_ready(self) -> int:
        """Ready messages with a key (some may wait for their key to be free)."""
        return self._ready.keyed

    @property
    def ready_count(self) -> int:
        """Ready messages now (delayed ones that fell due count once promoted)."""
        return self._ready.count

    def has_ready(self, now: float) -> bool:
        """True if a ``get_batch(now=now)`` would return a lease."""
        self._promote_due(now)
        return self._ready.count > 0

    def get_batch(self, max_items: int, *, now: float, owner: str | None = None,
                  min_priority: int | None = None, sizes: dict[str | None, int] | None = None) -> Lease | None:
        """Lease up to ``max_items`` ready messages, highest priority first, FIFO within one,
        to ``owner`` (see :meth:`take_back`); only of priority ``>= min_priority`` if given
        (what a consumer's reserved slot asks for). A typed policy's batch holds one type:
        ``sizes[t]``, if given, replaces ``max_items`` for a batch of type t. Keyed messages
        run one at a time per key (``daskqueue.queue.selection``).

        Returns ``None`` when nothing is ready. The lease expires at ``now + lease_timeout_s``.
        """
        if max_items <= 0:
            raise ValueError(f"max_items must be > 0, got {max_items!r}")
        self._promote_due(now)
        top = self._ready.top_priority
        if top is None or (min_priority is not None and top < min_priority):
            return None
        spans, t, typed = self._select.take(max_items, min_priority, sizes=sizes, peer_ready=self.peer_ready,
                                            peer_running=self.peer_running, slots=self.slots)
        if not spans:
            return None
        for span in spans:
            self._log(JournalEntry(Transition.LEASE, span))
        return self._make_lease(spans, now, owner, t, typed)

    def type_counts(self) -> dict[str | None, tuple[int, int]]:
        """``{type: (ready messages, running batches)}`` of this queue (what its peers add)."""
        ready, running = self._ready.by_type, self._running.as_dict()
        return {t: (ready.get(t, 0), running.get(t, 0)) for t in ready.keys() | running.keys()}

    def _make_lease(self, spans: list[Span], now: float, owner: str | None,
                    t: str | None = None, typed: bool = False) -> Lease:
        """A new lease of ``spans`` (out of the ready queues already) to ``owner``."""
        return self._leases.new(spans, deadline=now + self.lease_timeout_s, owner=owner, started=now, t=t,
                                typed=typed)

    # -- settle ---------------------------------------------------------------------------

    def check_settlement(
        self,
        lease_id: int,
        *,
        done: int,
        errors: dict[int, bytes] | None = None,
        fatal: frozenset[int] | set[int] = frozenset(),
    ) -> None:
        """Raise what :meth:`settle` would raise for these arguments, changing nothing:
        ``KeyError`` for an unknown lease, ``ValueError`` for positions outside it."""
        check_settlement(self._leases[lease_id], done, errors or {}, fatal)

    def settle(
        self,
        lease_id: int,
        *,
        done: int,
        errors: dict[int, bytes] | None = None,
        fatal: frozenset[int] | set[int] = frozenset(),
        now: float,
    ) -> Settlement:
        """Settle a lease: messages ``[0, done)`` ran, the rest are released unstarted.

        ``errors`` maps a position in the lease (``< done``) to the error of a failed run: that
        message is retried after a backoff, or dead-lettered once its attempts exceed
        ``max_retries`` (at once if the position is in ``fatal``). The other ran messages are
        acked; released ones go back to the front of the ready queue, attempts unchanged.
        Raises ``KeyError`` if the lease is unknown (expired or already settled).
        """
        self.check_settlement(lease_id, done=done, errors=errors, fatal=fatal)
        errors = errors or {}
        acked, failed, released = divide(self._leases.pop(lease_id).spans, done, errors)
        n_dead = sum(self._fail(one, errors[pos], now, fatal=pos in fatal) for one, pos in failed)
        for span in reversed(released):
            self._holders.unhold(span)
            self._ready.push(span, front=True)
        for span in released:
            self._log(JournalEntry(Transition.RELEASE, span))
        for span in acked:
            self._holders.unhold(span)
            self._log(JournalEntry(Transition.ACK, span))
        n_acked = done - len(failed)
        self._n.total_acked += n_acked
        return Settlement(n_acked, len(failed) - n_dead, n_dead, sum(s.count for s in released))

    def _fail(self, span: Span, error: bytes, now: float, *, fatal: bool = False) -> bool:
        """Retry ``span`` after a backoff, or dead-letter it; return True if dead-lettered."""
        attempts = span.attempts + 1
        if fatal or attempts > self.max_retries:
            self._holders.unhold(span)
            for i in range(span.start, span.stop):
                self._dead.add(span.chunk, i, attempts, error, now, self.detach)
            self._log(JournalEntry(Transition.DEAD, Span(span.chunk, span.start, span.stop, attempts), error=error))
            return True
        base_s, max_s, jitter = self._backoff
        delay = compute_backoff(attempts, base_s=base_s, max_s=max_s, jitter=jitter, rng=self._rng)
        self._n.total_retried += span.count
        retried = Span(span.chunk, span.start, span.stop, attempts)
        self._delayed.push(retried, now + delay)
        self._log(JournalEntry(Transition.RETRY, retried, time=now + delay))
        return False

    def dead_since(self, cursor: int) -> list[DeadLetter]:
        """The dead letters of ordinal ``>= cursor``, in order (see ``daskqueue.queue.dead``)."""
        return self._dead.since(cursor)

    # -- acting on dead letters and waiting messages -----------------------------------------

    def take_dead(self, seqs: set[int] | None = None) -> list[DeadLetter]:
        """Remove the dead letters with these seqs (all if None) and return them, in order
        (journalled as DEAD_DROP: a durable queue forgets them)."""
        taken = self._dead.take(seqs)
        self._n.total_purged += len(taken)
        for d in taken:
            self._log(JournalEntry(Transition.DEAD_DROP, Span(d.chunk, d.index, d.index + 1, d.attempts)))
        return taken

    def purge_waiting(self) -> int:
        """Drop every waiting (ready or delayed) message, settled with no outcome (journalled
        as acks); leased ones are left to finish. Returns how many."""
        spans = self._ready.clear() + self._delayed.clear()
        n = sum(s.count for s in spans)
        self._n.total_purged += n
        for span in spans:
            self._holders.unhold(span)
            self._log(JournalEntry(Transition.ACK, span))
        return n

    # -- leases ---------------------------------------------------------------------------

    def extend(self, lease_ids: list[int], *, now: float) -> list[int]:
        """Push the deadline of each live lease to ``now + lease_timeout_s``; return unknown ids."""
        deadline = now + self.lease_timeout_s
        return [lease_id for lease_id in lease_ids if not self._leases.extend(lease_id, deadline)]

    def expire(self, *, now: float) -> int:
        """Take back every lease whose deadline is ``<= now``; return how many messages."""
        n = 0
        for lease in self._leases.pop_expired(now):
            self._n.total_expired += lease.count
            n += self._end_lease(lease, LEASE_EXPIRED, now)
        return n

    def _end_lease(self, lease: Lease, error: bytes, now: float) -> int:
        """The messages of an ended lease did not run to an outcome: each fails with
        ``error`` (retried or dead-lettered)."""
        for span in lease.spans:
            self._fail(span, error, now)
        return lease.count

    def take_back(self, owners: set[str] | frozenset[str], error: bytes, *, now: float) -> int:
        """End every lease held by one of ``owners`` (their process died) as if it had
        expired now: each message counts an attempt and is retried after a backoff, or
        dead-lettered with ``error`` once past ``max_retries``. Returns how many messages.

        A message whose run kills its worker every time is thus dead-lettered, never
        redelivered forever (Dask's ``KilledWorker`` does the same for tasks)."""
        n = 0
        for lease_id in self._leases.owned_by(owners):
            n += self._end_lease(self._leases.pop(lease_id), error, now)
        self._n.total_taken_back += n
        return n

    def leases(self) -> list[Lease]:
        """Every live lease."""
        return list(self._leases)

    def lease(self, lease_id: int) -> Lease | None:
        """The live lease with this id, or None if it expired or was settled."""
        return self._leases.get(lease_id)

    def next_wakeup(self) -> float | None:
        """The earliest time a lease may expire or a delayed message becomes due, if any."""
        times = [t for t in (self._leases.next_deadline(), self._delayed.next_due()) if t is not None]
        return min(times) if times else None

    # -- helpers --------------------------------------------------------------------------

    def _promote_due(self, now: float) -> None:
        for span in self._delayed.pop_due(now):
            self._ready.push(span)
