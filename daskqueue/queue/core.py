"""The queue core: a pure state machine for the message lifecycle.

No Dask, no clock reads, no I/O: every method that depends on time takes ``now`` (seconds,
any monotonic origin), and randomness (backoff jitter) comes from a seeded ``random.Random``.
Actor shells (``TransientQueue``, ``DurableQueue``) add the clock, the timers, the waiters and
storage around one instance.

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

Not thread-safe: the owner (an actor on one event loop) serialises calls.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import itertools
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from daskqueue.queue.backoff import compute_backoff
from daskqueue.queue.policy import FIFO, TypePolicy
from daskqueue.segment.format import IndexType

__all__ = ["Chunk", "Span", "Lease", "DeadLetter", "JournalEntry", "QueueCore", "CoreStats", "LEASE_EXPIRED", "MOVER"]

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


class JournalEntry(NamedTuple):
    """One journalled transition of a span; ``kind`` is the index record that persists it.

    LEASE, RELEASE and ACK carry the span; RETRY also the ``time`` it is due again; DEAD also
    the ``error`` (its span's ``attempts`` count the failed run).
    """

    kind: IndexType
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
class _Counters:
    ready: int = 0
    delayed: int = 0
    leased: int = 0
    total_put: int = 0
    total_acked: int = 0
    total_retried: int = 0
    total_expired: int = 0
    total_taken_back: int = 0
    total_moved: int = 0
    total_purged: int = 0  # dead letters and waiting messages dropped by purge / replayed


#: The owner of the leases that hold messages on their way to another queue.
MOVER = "daskqueue-mover"


class QueueCore:
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
        self._lease_ids = itertools.count(lease_id_base + 1)
        self._ticket = itertools.count()  # tie-breaker for heaps
        self._ready: dict[int, deque[Span]] = {}  # priority -> spans, FIFO within a priority
        self._priorities: list[int] = []  # keys of _ready, highest first
        self._delayed: list[tuple[float, int, Span]] = []  # heap by not_before
        self._leases: dict[int, Lease] = {}
        self._deadlines: list[tuple[float, int]] = []  # heap of (deadline, lease_id), lazy
        self.dead: list[DeadLetter] = []
        self._n = _Counters()
        #: When a list, every transition is appended to it as a :class:`JournalEntry`, in
        #: order, for a durable shell to persist; None (the default) records nothing.
        self.journal: list[JournalEntry] | None = None
        # Type scheduling (see daskqueue.queue.policy); inert under FIFO.
        self.policy = policy
        self._typed = policy.typed
        #: The pool's running slots (consumers x max_concurrency), told by the shell.
        self.slots = 0
        #: Ready messages and running batches per type in the pool's other queues (the
        #: shell keeps them from its peers' reports); added to this queue's own counts.
        self.peer_ready: dict[str | None, int] = {}
        self.peer_running: dict[str | None, int] = {}
        self._ready_by_type: dict[str | None, int] = {}
        self._running_by_type: dict[str | None, int] = {}
        # Keyed messages run one at a time per key, in put order: a key is held by the seq
        # of its message in flight (leased, or failed and waiting for its retry) until that
        # one is acked, dead-lettered or released; the key's later messages wait.
        self._key_holder: dict[str, int] = {}
        self._keyed_ready = 0  # ready messages with a key: 0 keeps the plain FIFO path
        # Keys whose earlier messages are still in another queue (they moved here from it
        # while one of them ran there): none of theirs runs here until they are unfenced.
        self._fenced: set[str] = set()
        self.max_scan = policy.max_scan
        #: ``detach(chunk, i)``: the payload of message ``i`` of ``chunk`` alone, for its dead
        #: letter (set by the shell; None keeps the whole chunk's payload).
        self.detach: Any = None
        #: Dead letters appended so far (their ``ordinal``s count up): what a client's cursor
        #: over them counts, since ``take_dead`` may remove any of them.
        self.dead_appended = 0

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
            self._delay(span, not_before)
        else:
            self._push_ready(span)

    # -- get ------------------------------------------------------------------------------

    @property
    def top_priority(self) -> int | None:
        """The highest priority among ready messages (None when none is ready)."""
        return self._priorities[0] if self._n.ready else None

    @property
    def keyed_ready(self) -> int:
        """Ready messages with a key (some may wait for their key to be free)."""
        return self._keyed_ready

    @property
    def ready_count(self) -> int:
        """Ready messages now (delayed ones that fell due count once promoted)."""
        return self._n.ready

    def has_ready(self, now: float) -> bool:
        """True if a ``get_batch(now=now)`` would return a lease."""
        self._promote_due(now)
        return self._n.ready > 0

    def get_batch(self, max_items: int, *, now: float, owner: str | None = None,
                  min_priority: int | None = None, sizes: dict[str | None, int] | None = None) -> Lease | None:
        """Lease up to ``max_items`` ready messages, highest priority first, FIFO within one,
        to ``owner`` (see :meth:`take_back`); only of priority ``>= min_priority`` if given
        (what a consumer's reserved slot asks for). A typed policy's batch holds one type:
        ``sizes[t]``, if given, replaces ``max_items`` for a batch of type t.

        Returns ``None`` when nothing is ready. The lease expires at ``now + lease_timeout_s``.
        """
        if max_items <= 0:
            raise ValueError(f"max_items must be > 0, got {max_items!r}")
        self._promote_due(now)
        if self._n.ready == 0:
            return None
        if min_priority is not None and self._priorities[0] < min_priority:
            return None
        if self._typed:
            return self._get_typed(max_items, now, owner, min_priority, sizes)
        if self._keyed_ready:
            return self._get_keyed(max_items, now, owner, min_priority)
        spans: list[Span] = []
        want = max_items
        while want and self._priorities:
            prio = self._priorities[0]
            if min_priority is not None and prio < min_priority:
                break
            dq = self._ready[prio]
            while want and dq:
                span = dq.popleft()
                if span.count > want:
                    span, rest = span.split(want)
                    dq.appendleft(rest)
                spans.append(span)
                want -= span.count
                self._log(JournalEntry(IndexType.LEASE, span))
            if not dq:
                del self._ready[prio]
                self._priorities.pop(0)
        taken = max_items - want
        if not taken:
            return None
        self._n.ready -= taken
        self._n.leased += taken
        lease = Lease(next(self._lease_ids), spans, now + self.lease_timeout_s, taken, owner, now)
        self._leases[lease.lease_id] = lease
        heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id))
        return lease

    # -- keyed delivery: one message at a time per key, in put order ----------------------

    def _key_free(self, span: Span) -> bool:
        """Whether ``span``'s first message may be leased as far as its key goes."""
        key = span.chunk.key
        if key is None:
            return True
        if key in self._fenced:
            return False
        holder = self._key_holder.get(key)
        return holder is None or holder == span.first_seq

    def _get_keyed(self, max_items: int, now: float, owner: str | None, min_priority: int | None) -> Lease | None:
        """The FIFO path when keyed messages are ready: the first ``max_items`` messages in
        priority and put order that may run now, at most one per key (within ``max_scan``
        runs per priority); the others keep their places."""
        spans: list[Span] = []
        want = max_items
        for prio in list(self._priorities):
            if not want or (min_priority is not None and prio < min_priority):
                break
            want = self._take_from(prio, want, spans, lambda span: True)
        return self._make_lease(spans, max_items - want, now, owner)

    def _take_from(self, prio: int, want: int, spans: list[Span], wanted: Any) -> int:
        """Move up to ``want`` messages of priority ``prio`` whose span ``wanted(span)`` and
        whose key is free into ``spans`` (one per key), in order; return how many are left
        to take. Runs skipped keep their places."""
        dq = self._ready[prio]
        kept: list[Span] = []
        taken_keys: set[str] = {s.chunk.key for s in spans if s.chunk.key is not None}
        for _ in range(self.max_scan):
            if not dq or not want:
                break
            span = dq.popleft()
            key = span.chunk.key
            if not wanted(span) or not self._key_free(span) or key in taken_keys:
                kept.append(span)
                continue
            n = want if key is None else 1
            if span.count > n:
                span, rest = span.split(n)
                kept.append(rest)
            if key is not None:
                taken_keys.add(key)
                self._key_holder[key] = span.first_seq
                self._keyed_ready -= span.count
            spans.append(span)
            want -= span.count
            self._log(JournalEntry(IndexType.LEASE, span))
        dq.extendleft(reversed(kept))
        if not dq:
            del self._ready[prio]
            self._priorities.remove(prio)
        return want

    def _make_lease(self, spans: list[Span], n: int, now: float, owner: str | None,
                    t: Any = None, typed: bool = False) -> Lease | None:
        if not n:
            return None
        self._n.ready -= n
        self._n.leased += n
        if typed:
            self._ready_by_type[t] -= n
            if not self._ready_by_type[t]:
                del self._ready_by_type[t]
            self._running_by_type[t] = self._running_by_type.get(t, 0) + 1
        lease = Lease(next(self._lease_ids), spans, now + self.lease_timeout_s, n, owner, now, typed, t)
        self._leases[lease.lease_id] = lease
        heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id))
        return lease

    def _unhold(self, span: Span) -> None:
        """``span``'s message is settled (acked, dead) or released: its key is free."""
        key = span.chunk.key
        if key is not None and self._key_holder.get(key) == span.first_seq:
            del self._key_holder[key]

    def rebuild_key_holders(self) -> None:
        """After a restore or an import: every key whose message is leased, or was retried
        (attempts > 0: it ran before its key's later messages), is held by that message."""
        self._key_holder = {}
        live = [s for lease in self._leases.values() for s in lease.spans]
        live += [s for _, _, s in self._delayed if s.attempts]
        live += [s for p in self._priorities for s in self._ready[p] if s.attempts]
        for span in live:
            key = span.chunk.key
            if key is not None and (key not in self._key_holder or span.first_seq < self._key_holder[key]):
                self._key_holder[key] = span.first_seq

    # -- moving messages to another queue (queues added to or removed from a pool) --------

    def fence(self, keys: list[str] | set[str]) -> None:
        """Hold ``keys`` here until :meth:`unfence`: an earlier message of each still runs
        in the queue they moved from."""
        self._fenced.update(keys)

    def unfence(self, keys: list[str] | set[str]) -> None:
        """The queue ``keys`` moved from holds none of their messages any more."""
        self._fenced.difference_update(keys)

    @property
    def fenced(self) -> set[str]:
        return set(self._fenced)

    def holds(self, span: Span) -> bool:
        """Whether ``span``'s first message holds its key (it ran, or runs, before the rest)."""
        key = span.chunk.key
        return key is not None and self._key_holder.get(key) == span.first_seq

    def keys_present(self, keys: set[str]) -> set[str]:
        """Those of ``keys`` that a message here still has (held, waiting or leased)."""
        present = {k for k in keys if k in self._key_holder or k in self._fenced}
        for span, _ in self.live_spans():
            if span.chunk.key in keys:
                present.add(span.chunk.key)
        return present

    def take_moving(self, dest: Any, *, now: float) -> tuple[dict[int, Lease], dict[int, list[float]], dict[int, set[str]]]:
        """Lease to :data:`MOVER` every waiting (ready or delayed) message whose chunk
        ``dest(chunk)`` sends to another queue (an int; None: it stays), but a message that
        holds its key: that one runs here first, and its key is fenced at its new queue.

        Returns, per destination, the lease (its spans in put order), the seconds until each
        span is due (0: ready), and the keys held here that the destination must fence. Each
        lease is then :meth:`drop_moved` once the destination stored its messages, or
        settled with ``done=0`` (released) if it did not.
        """
        taken: dict[int, list[tuple[Span, float]]] = {}
        for prio in list(self._priorities):
            dq = self._ready[prio]
            kept: deque[Span] = deque()
            for span in dq:
                d = None if self.holds(span) else dest(span.chunk)
                if d is None:
                    kept.append(span)
                    continue
                taken.setdefault(d, []).append((span, 0.0))
                self._n.ready -= span.count
                if span.chunk.key is not None:
                    self._keyed_ready -= span.count
                if self._typed:
                    t = span.chunk.type
                    self._ready_by_type[t] -= span.count
                    if not self._ready_by_type[t]:
                        del self._ready_by_type[t]
            if kept:
                self._ready[prio] = kept
            else:
                del self._ready[prio]
                self._priorities.remove(prio)
        delayed = []
        for entry in self._delayed:
            not_before, _, span = entry
            d = None if self.holds(span) else dest(span.chunk)
            if d is None:
                delayed.append(entry)
                continue
            taken.setdefault(d, []).append((span, max(0.0, not_before - now)))
            self._n.delayed -= span.count
        if len(delayed) != len(self._delayed):
            heapq.heapify(delayed)
            self._delayed = delayed
        leases, delays, fences = {}, {}, {}
        for d, spans in taken.items():
            spans.sort(key=lambda sd: sd[0].first_seq)
            for span, _ in spans:
                self._log(JournalEntry(IndexType.LEASE, span))
            count = sum(s.count for s, _ in spans)
            self._n.ready += count  # _make_lease counts them out of ready
            lease = leases[d] = self._make_lease([s for s, _ in spans], count, now, MOVER)
            # A mover lease never expires (its heap entry goes stale): its messages must not be
            # redelivered here while the destination may be storing them.
            lease.deadline = math.inf
            delays[d] = [delay for _, delay in spans]
            # A key held here, or fenced here (it moved here while it ran elsewhere), is
            # fenced at the destination too.
            fences[d] = {s.chunk.key for s, _ in spans
                         if s.chunk.key in self._key_holder or s.chunk.key in self._fenced}
        return leases, delays, fences  # type: ignore[return-value]

    def return_moved(self, lease_id: int, delays: list[float], *, now: float) -> None:
        """A move failed: the messages of mover lease ``lease_id`` stay here, each span back
        where it was, ready (at the front) or delayed for the ``delays`` it had left."""
        lease = self._leases.pop(lease_id)
        self._lease_ended(lease)
        self._n.leased -= lease.count
        for span, delay in reversed(list(zip(lease.spans, delays))):
            if delay > 0:
                self._delay(span, now + delay)
                self._log(JournalEntry(IndexType.RETRY, span, time=now + delay))
            else:
                self._push_ready(span, front=True)
                self._log(JournalEntry(IndexType.RELEASE, span))

    def drop_moved(self, lease_id: int) -> int:
        """The messages of mover lease ``lease_id`` are stored in their new queue: they
        leave this one, with no outcome here (journalled as acks). Returns how many."""
        lease = self._leases.pop(lease_id)
        self._lease_ended(lease)
        self._n.leased -= lease.count
        self._n.total_moved += lease.count
        for span in lease.spans:
            self._log(JournalEntry(IndexType.ACK, span))
        return lease.count

    # -- typed delivery (fair / capped) ----------------------------------------------------

    def type_counts(self) -> dict[str | None, tuple[int, int]]:
        """``{type: (ready messages, running batches)}`` of this queue (what its peers add)."""
        types = self._ready_by_type.keys() | self._running_by_type.keys()
        return {t: (self._ready_by_type.get(t, 0), self._running_by_type.get(t, 0)) for t in types}

    def _get_typed(self, max_items: int, now: float, owner: str | None,
                   min_priority: int | None = None, sizes: dict[str | None, int] | None = None) -> Lease | None:
        """Lease up to ``max_items`` messages of one type: of the highest priority, the first
        run of messages (within ``max_scan``) whose type is under its pool-wide limit; if none
        is, the first whose type is under its hard cap (a fair share is soft, a cap is not)."""
        policy = self.policy
        ready = dict(self._ready_by_type)
        for t, n in self.peer_ready.items():
            ready[t] = ready.get(t, 0) + n

        def running(t: str | None) -> int:
            return self._running_by_type.get(t, 0) + self.peer_running.get(t, 0)

        def under_limit(t: str | None) -> bool:
            limit = policy.limit(t, ready=ready, slots=self.slots)
            return limit is None or running(t) < limit

        def under_cap(t: str | None) -> bool:
            cap = policy.hard_cap(t)
            return cap is None or running(t) < cap

        pick = fallback = None
        for prio in self._priorities:
            if min_priority is not None and prio < min_priority:
                break
            for span in itertools.islice(self._ready[prio], policy.max_scan):
                t = span.chunk.type
                if not self._key_free(span):
                    continue
                if under_limit(t):
                    pick = (prio, t)
                    break
                if fallback is None and under_cap(t):
                    fallback = (prio, t)
            if pick is not None:
                break
        pick = pick or fallback
        if pick is None:
            return None
        if sizes:
            max_items = max(1, sizes.get(pick[1], max_items))
        return self._lease_type(*pick, max_items, now, owner)

    def _lease_type(self, prio: int, t: str | None, max_items: int, now: float, owner: str | None) -> Lease | None:
        """Lease the first ``max_items`` ready messages of type ``t`` and priority ``prio``
        (within ``max_scan`` runs, one per key); the other runs keep their places."""
        spans: list[Span] = []
        want = self._take_from(prio, max_items, spans, lambda span: span.chunk.type == t)
        return self._make_lease(spans, max_items - want, now, owner, t, typed=True)

    def _lease_ended(self, lease: Lease) -> None:
        """A typed lease ended (settled, expired, taken back): its type runs one batch fewer."""
        if lease.typed:
            left = self._running_by_type[lease.type] - 1
            if left:
                self._running_by_type[lease.type] = left
            else:
                del self._running_by_type[lease.type]

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
        lease = self._leases[lease_id]
        errors = errors or {}
        if not 0 <= done <= lease.count:
            raise ValueError(f"done={done} outside 0..{lease.count}")
        bad = [i for i in errors if not 0 <= i < done]
        if bad:
            raise ValueError(f"error positions {bad[:5]} outside the {done} messages that ran")
        stray = [i for i in fatal if i not in errors]
        if stray:
            raise ValueError(f"fatal positions {sorted(stray)[:5]} have no error")

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
        lease = self._leases.pop(lease_id)
        self._lease_ended(lease)
        errors = errors or {}
        self._n.leased -= lease.count
        acked: list[Span] = []
        released: list[Span] = []
        n_retried = n_dead = 0
        pos = 0
        for span in lease.spans:
            end = pos + span.count
            if end <= done:
                ran, rest = span, None
            elif pos >= done:
                ran, rest = None, span
            else:
                ran, rest = span.split(done - pos)
            if rest is not None:
                released.append(rest)
            if ran is not None:
                r, d = self._settle_ran(ran, pos, errors, fatal, acked, now)
                n_retried += r
                n_dead += d
            pos = end
        for span in reversed(released):
            self._unhold(span)
            self._push_ready(span, front=True)
        for span in released:
            self._log(JournalEntry(IndexType.RELEASE, span))
        for span in acked:
            self._unhold(span)
            self._log(JournalEntry(IndexType.ACK, span))
        n_released = sum(s.count for s in released)
        n_acked = done - n_retried - n_dead
        self._n.total_acked += n_acked
        return Settlement(n_acked, n_retried, n_dead, n_released)

    def _settle_ran(
        self,
        span: Span,
        pos: int,
        errors: dict[int, bytes],
        fatal: frozenset[int] | set[int],
        acked: list[Span],
        now: float,
    ) -> tuple[int, int]:
        """Ack ``span`` (at lease position ``pos``) except its failed messages; count outcomes."""
        failed = sorted(p - pos for p in errors if pos <= p < pos + span.count) if errors else []
        n_retried = n_dead = 0
        cursor = span.start
        for offset in failed:
            i = span.start + offset
            if i > cursor:
                acked.append(Span(span.chunk, cursor, i, span.attempts))
            one = Span(span.chunk, i, i + 1, span.attempts)
            if self._fail(one, errors[pos + offset], now, fatal=(pos + offset) in fatal):
                n_dead += 1
            else:
                n_retried += 1
            cursor = i + 1
        if cursor < span.stop:
            acked.append(Span(span.chunk, cursor, span.stop, span.attempts))
        return n_retried, n_dead

    def _fail(self, span: Span, error: bytes, now: float, *, fatal: bool = False) -> bool:
        """Retry ``span`` after a backoff, or dead-letter it; return True if dead-lettered."""
        attempts = span.attempts + 1
        if fatal or attempts > self.max_retries:
            self._unhold(span)
            for i in range(span.start, span.stop):
                self.dead.append(self._dead_letter(span.chunk, i, attempts, error, now))
            self._log(JournalEntry(IndexType.DEAD, Span(span.chunk, span.start, span.stop, attempts), error=error))
            return True
        base_s, max_s, jitter = self._backoff
        delay = compute_backoff(attempts, base_s=base_s, max_s=max_s, jitter=jitter, rng=self._rng)
        self._n.total_retried += span.count
        retried = Span(span.chunk, span.start, span.stop, attempts)
        self._delay(retried, now + delay)
        self._log(JournalEntry(IndexType.RETRY, retried, time=now + delay))
        return False

    def _dead_letter(self, chunk: Chunk, i: int, attempts: int, error: bytes, now: float) -> DeadLetter:
        seq = chunk.base_seq + i
        ordinal, self.dead_appended = self.dead_appended, self.dead_appended + 1
        if self.detach is None:
            return DeadLetter(seq, chunk, i, attempts, error, now, ordinal)
        own = Chunk(seq, 1, chunk.priority, self.detach(chunk, i), chunk.meta, True, chunk.type, chunk.key)
        return DeadLetter(seq, own, 0, attempts, error, now, ordinal)

    def dead_since(self, cursor: int) -> list[DeadLetter]:
        """The dead letters of ordinal ``>= cursor``, in order."""
        i = bisect.bisect_left(self.dead, cursor, key=lambda d: d.ordinal)
        return self.dead[i:]

    # -- acting on dead letters and waiting messages -----------------------------------------

    def take_dead(self, seqs: set[int] | None = None) -> list[DeadLetter]:
        """Remove the dead letters with these seqs (all if None) and return them, in order
        (journalled as DEAD_DROP: a durable queue forgets them)."""
        if seqs is None:
            taken, self.dead = self.dead, []
        else:
            taken = [d for d in self.dead if d.seq in seqs]
            if taken:
                self.dead = [d for d in self.dead if d.seq not in seqs]
        self._n.total_purged += len(taken)
        for d in taken:
            self._log(JournalEntry(IndexType.DEAD_DROP, Span(d.chunk, d.index, d.index + 1, d.attempts)))
        return taken

    def purge_waiting(self) -> int:
        """Drop every waiting (ready or delayed) message, settled with no outcome (journalled
        as acks); leased ones are left to finish. Returns how many."""
        spans = [s for p in self._priorities for s in self._ready[p]] + [s for _, _, s in self._delayed]
        self._ready, self._priorities, self._delayed = {}, [], []
        self._ready_by_type = {}
        n = sum(s.count for s in spans)
        self._n.ready = self._n.delayed = 0
        self._keyed_ready = 0
        self._n.total_purged += n
        for span in spans:
            self._unhold(span)
            self._log(JournalEntry(IndexType.ACK, span))
        return n

    # -- leases ---------------------------------------------------------------------------

    def extend(self, lease_ids: list[int], *, now: float) -> list[int]:
        """Push the deadline of each live lease to ``now + lease_timeout_s``; return unknown ids."""
        unknown = []
        deadline = now + self.lease_timeout_s
        for lease_id in lease_ids:
            lease = self._leases.get(lease_id)
            if lease is None:
                unknown.append(lease_id)
            elif deadline > lease.deadline:
                lease.deadline = deadline
                heapq.heappush(self._deadlines, (deadline, lease_id))
        return unknown

    def expire(self, *, now: float) -> int:
        """Take back every lease whose deadline is ``<= now``; return how many messages."""
        n = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, lease_id = heapq.heappop(self._deadlines)
            lease = self._leases.get(lease_id)
            if lease is None or lease.deadline != deadline:
                continue  # settled already, or extended (a later heap entry stands for it)
            self._n.total_expired += lease.count
            n += self._end_lease(lease_id, LEASE_EXPIRED, now)
        return n

    def _end_lease(self, lease_id: int, error: bytes, now: float) -> int:
        """Drop a live lease whose messages did not run to an outcome: each fails with
        ``error`` (retried or dead-lettered). Its deadline heap entry goes stale."""
        lease = self._leases.pop(lease_id)
        self._lease_ended(lease)
        self._n.leased -= lease.count
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
        for lease_id in [i for i, lease in self._leases.items() if lease.owner in owners]:
            n += self._end_lease(lease_id, error, now)
        self._n.total_taken_back += n
        return n

    def leases(self) -> list[Lease]:
        """Every live lease."""
        return list(self._leases.values())

    def lease(self, lease_id: int) -> Lease | None:
        """The live lease with this id, or None if it expired or was settled."""
        return self._leases.get(lease_id)

    def next_wakeup(self) -> float | None:
        """The earliest time a lease may expire or a delayed message becomes due, if any."""
        times = []
        while self._deadlines:
            deadline, lease_id = self._deadlines[0]
            lease = self._leases.get(lease_id)
            if lease is not None and lease.deadline == deadline:
                times.append(deadline)
                break
            heapq.heappop(self._deadlines)  # stale entry
        if self._delayed:
            times.append(self._delayed[0][0])
        return min(times) if times else None

    # -- helpers --------------------------------------------------------------------------

    def _push_ready(self, span: Span, *, front: bool = False) -> None:
        prio = span.chunk.priority
        dq = self._ready.get(prio)
        if dq is None:
            dq = self._ready[prio] = deque()
            self._priorities.append(prio)
            self._priorities.sort(reverse=True)
        if front:
            dq.appendleft(span)
        else:
            dq.append(span)
        self._n.ready += span.count
        if span.chunk.key is not None:
            self._keyed_ready += span.count
        if self._typed:
            t = span.chunk.type
            self._ready_by_type[t] = self._ready_by_type.get(t, 0) + span.count

    def _delay(self, span: Span, not_before: float) -> None:
        heapq.heappush(self._delayed, (not_before, next(self._ticket), span))
        self._n.delayed += span.count

    def _promote_due(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            _, _, span = heapq.heappop(self._delayed)
            self._n.delayed -= span.count
            self._push_ready(span)

    # -- restoring (recovery of a durable queue) ------------------------------------------

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
                self._delay(span, not_before)
            else:
                self._push_ready(span)

    def restore_dead(self, seq: int, attempts: int, error: bytes, meta: Any = None, *, payload: Any = None,
                     priority: int = 0, at: float = 0.0) -> None:
        """Bring back a dead letter (with its payload and meta, when they were kept)."""
        self._next_seq = max(self._next_seq, seq + 1)
        self._n.total_put += 1
        t = getattr(meta, "type", None)
        key = getattr(meta, "key", None)
        chunk = Chunk(seq, 1, priority, payload, meta, True, t, key)
        self.dead.append(DeadLetter(seq, chunk, 0, attempts, error, at, self.dead_appended))
        self.dead_appended += 1

    def advance_seq(self, next_seq: int) -> None:
        """Never hand out a sequence number below ``next_seq`` (ids are never reused)."""
        self._next_seq = max(self._next_seq, next_seq)

    def restore_lease(
        self, lease_id: int, spans: list[Span], *, deadline: float, owner: str | None, started: float
    ) -> None:
        """Bring back a live lease under its id (a queue handed over by its previous actor):
        its spans stay leased, attempts unchanged, and its holder may settle or extend it."""
        if lease_id in self._leases:
            raise ValueError(f"lease {lease_id} exists already")
        count = sum(s.count for s in spans)
        for span in spans:
            span.chunk.enqueued = True
            self._next_seq = max(self._next_seq, span.chunk.base_seq + span.chunk.count)
        self._n.total_put += count
        self._n.leased += count
        types = {s.chunk.type for s in spans}
        typed = self._typed and len(types) == 1  # a FIFO lease of mixed types is not counted
        t = types.pop() if typed else None
        if typed:
            self._running_by_type[t] = self._running_by_type.get(t, 0) + 1
        self._leases[lease_id] = Lease(lease_id, spans, deadline, count, owner, started, typed, t)
        heapq.heappush(self._deadlines, (deadline, lease_id))

    def export_state(self, *, now: float) -> dict[str, Any]:
        """Everything this core holds, for a successor on another process (``import_state``):
        times are made relative to ``now``, since clocks differ between processes. Spans
        share their chunks, so pickling the result keeps each payload once."""
        next_lease_id = next(self._lease_ids)
        self._lease_ids = itertools.count(next_lease_id)
        return {
            "next_seq": self._next_seq,
            "next_lease_id": next_lease_id,
            "ready": [s for p in self._priorities for s in self._ready[p]],
            "delayed": [(t - now, s) for t, _, s in sorted(self._delayed, key=lambda d: d[:2])],
            "leases": [(lease.lease_id, lease.deadline - now, lease.owner, lease.started - now, lease.spans)
                       for lease in self._leases.values()],
            "dead": [dataclasses.replace(d, at=d.at - now) for d in self.dead],
            "totals": (self._n.total_put, self._n.total_acked, self._n.total_retried,
                       self._n.total_expired, self._n.total_taken_back, self._n.total_moved,
                       self._n.total_purged),
            "fenced": sorted(self._fenced),
            "dead_appended": self.dead_appended,
        }

    def import_state(self, state: dict[str, Any], *, now: float) -> None:
        """Take over what ``export_state`` gave, into this empty core, with times from ``now``."""
        if self._n.total_put or self._next_seq:
            raise ValueError("import_state needs an empty queue core")
        for span in state["ready"]:
            self._push_ready(span)
        for due_in, span in state["delayed"]:
            self._delay(span, now + due_in)
        for lease_id, deadline_in, owner, started_in, spans in state["leases"]:
            self.restore_lease(lease_id, spans, deadline=now + deadline_in, owner=owner, started=now + started_in)
        self.dead = [dataclasses.replace(d, at=now + d.at) for d in state["dead"]]
        # Ids count up from a random base per actor; should this one's range reach the
        # imported ids, start past them: a new lease must never take a live lease's id.
        nxt, theirs = next(self._lease_ids), state["next_lease_id"]
        self._lease_ids = itertools.count(theirs if 0 <= theirs - nxt < 1 << 32 else nxt)
        n = self._n
        (n.total_put, n.total_acked, n.total_retried, n.total_expired, n.total_taken_back,
         n.total_moved, n.total_purged) = state["totals"]
        self._fenced = set(state["fenced"])
        self.dead_appended = state["dead_appended"]
        self._next_seq = state["next_seq"]
        self.rebuild_key_holders()

    def live_spans(self) -> list[tuple[Span, str]]:
        """Every unsettled span with its state: ``"ready"``, ``"delayed"`` or ``"leased"``."""
        out = [(s, "ready") for p in self._priorities for s in self._ready[p]]
        out += [(s, "delayed") for _, _, s in self._delayed]
        out += [(s, "leased") for lease in self._leases.values() for s in lease.spans]
        return out

    # -- inspection -----------------------------------------------------------------------

    def stats(self) -> CoreStats:
        n = self._n
        return CoreStats(
            ready=n.ready,
            delayed=n.delayed,
            leased=n.leased,
            dead=len(self.dead),
            total_put=n.total_put,
            total_acked=n.total_acked,
            total_retried=n.total_retried,
            total_expired=n.total_expired,
            total_taken_back=n.total_taken_back,
            total_moved=n.total_moved,
            total_purged=n.total_purged,
        )

    def validate(self) -> None:
        """Check every invariant; raise ``AssertionError`` naming the first that fails."""
        n = self._n
        ready = sum(s.count for dq in self._ready.values() for s in dq)
        assert ready == n.ready, f"ready count {n.ready} != {ready} in spans"
        assert all(self._ready[p] for p in self._priorities), "empty priority deque kept"
        assert sorted(self._ready, reverse=True) == self._priorities, "priority order broken"
        delayed = sum(s.count for _, _, s in self._delayed)
        assert delayed == n.delayed, f"delayed count {n.delayed} != {delayed} in heap"
        leased = sum(lease.count for lease in self._leases.values())
        assert leased == n.leased, f"leased count {n.leased} != {leased} in leases"
        for lease in self._leases.values():
            assert lease.count == sum(s.count for s in lease.spans), "lease count != its spans"
            assert lease.owner == MOVER or (lease.deadline, lease.lease_id) in self._deadlines, "lease missing from heap"
        spans = [s for dq in self._ready.values() for s in dq]
        spans += [s for _, _, s in self._delayed]
        spans += [s for lease in self._leases.values() for s in lease.spans]
        for s in spans:
            assert 0 <= s.start < s.stop <= s.chunk.count, f"bad span {s.start}..{s.stop}"
            assert 0 <= s.attempts <= self.max_retries, f"span attempts {s.attempts}"
        seqs = [s.chunk.base_seq + i for s in spans for i in range(s.start, s.stop)]
        seqs += [d.seq for d in self.dead]
        assert len(seqs) == len(set(seqs)), "a message is in two places"
        keyed = sum(s.count for dq in self._ready.values() for s in dq if s.chunk.key is not None)
        assert keyed == self._keyed_ready, f"keyed ready {self._keyed_ready} != {keyed}"
        leased_keys = [s.chunk.key for lease in self._leases.values() if lease.owner != MOVER
                       for s in lease.spans if s.chunk.key]
        assert len(leased_keys) == len(set(leased_keys)), "two messages of one key leased at once"
        for key in leased_keys:
            assert key in self._key_holder, f"leased key {key!r} not held"
        if self._typed:
            by_type: dict[str | None, int] = {}
            for dq in self._ready.values():
                for s in dq:
                    by_type[s.chunk.type] = by_type.get(s.chunk.type, 0) + s.count
            assert by_type == self._ready_by_type, f"ready by type {self._ready_by_type} != {by_type}"
            leases: dict[str | None, int] = {}
            for lease in self._leases.values():
                if lease.typed:
                    assert all(s.chunk.type == lease.type for s in lease.spans), "mixed typed lease"
                    leases[lease.type] = leases.get(lease.type, 0) + 1
            assert leases == self._running_by_type, f"running {self._running_by_type} != {leases}"
        settled = n.total_acked + len(self.dead) + n.total_moved + n.total_purged
        assert n.total_put == settled + n.ready + n.delayed + n.leased, (
            f"put {n.total_put} != acked+dead+moved {settled} + ready {n.ready} + delayed "
            f"{n.delayed} + leased {n.leased}"
        )
