"""The actor shell around :class:`~daskqueue.queue.core.QueueCore`.

Adds what the core leaves out: the clock, a sweeper task that expires leases and promotes
delayed messages, long-polling waiters, the function table, and the results and dead letters
waiting to be fetched by the client. Storage is a pair of hooks a durable subclass fills in.

Threading: every public method is ``async def`` and runs on the worker's event loop; none
blocks. Work per call is bounded by the size of its blob. Work that grows with the whole
queue (a durable queue's compaction) runs on a thread of its own while the queue is *paused*
(``_run_paused``): every method waits for it at the gate (``_unpaused``) before it reads or
changes any state, so that thread is the only one touching the queue while it runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from daskqueue import defaults
from daskqueue.errors import LeaseExpiredError, PayloadTooLargeError, QueueClosedError, QueueEmpty
from daskqueue.messages import killed_error
from daskqueue.queue.core import Chunk, Lease, QueueCore, Settlement, Span
from daskqueue.serialize import PROTOCOL, ResultRecord, Segment, decode_put, decode_settle, encode_delivery

__all__ = ["QueueActorBase", "QueueStats", "ChunkPayload"]

logger = logging.getLogger("daskqueue")

T = TypeVar("T")

#: Lease ids of a queue actor start at a random 48-bit number shifted by 16 bits: a reopened
#: durable queue never reuses the ids its previous incarnation handed out.
_LEASE_ID_BASE_BITS = 48


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of one queue: messages per state, lifetime totals and call counts."""

    index: int
    kind: str
    ready: int
    delayed: int
    leased: int
    dead: int
    total_put: int
    total_acked: int
    total_retried: int
    total_expired: int
    total_worker_lost: int  # leased to a consumer whose worker died: taken back at once
    get_calls: int
    closed: bool

    @property
    def pending(self) -> int:
        """Messages not yet settled (ready, delayed or leased)."""
        return self.ready + self.delayed + self.leased


@dataclass(frozen=True, slots=True)
class ChunkPayload:
    """The bytes of a chunk's messages (``Chunk.payload`` in a queue actor).

    ``offsets`` holds ``count + 1`` uint32 offsets into ``data``, the payloads concatenated. A
    durable queue replaces it by ``stored_at(segment, offset)`` once its CHUNK log record is
    written: ``segment`` is None until then.
    """

    offsets: array
    data: bytes
    segment: int | None = None
    offset: int = 0

    def stored_at(self, segment: int, offset: int) -> ChunkPayload:
        """The same payload, whose CHUNK log record is at ``offset`` of log ``segment``."""
        return ChunkPayload(self.offsets, self.data, segment, offset)


class QueueActorBase:
    """Shared shell of the queue actors; see :class:`TransientQueue` for the public contract."""

    kind = "base"

    def __init__(
        self,
        index: int = 0,
        *,
        lease_timeout_s: float = defaults.LEASE_TIMEOUT_S,
        max_retries: int = defaults.MAX_RETRIES,
        retry_backoff_base_s: float = defaults.RETRY_BACKOFF_BASE_S,
        retry_backoff_max_s: float = defaults.RETRY_BACKOFF_MAX_S,
        retry_backoff_jitter: float = defaults.RETRY_BACKOFF_JITTER,
        max_message_bytes: int = defaults.MAX_MESSAGE_BYTES,
        seed: int | None = None,
    ) -> None:
        self.index = index
        self.max_message_bytes = max_message_bytes
        self._core = QueueCore(
            lease_timeout_s=lease_timeout_s,
            max_retries=max_retries,
            retry_backoff_base_s=retry_backoff_base_s,
            retry_backoff_max_s=retry_backoff_max_s,
            retry_backoff_jitter=retry_backoff_jitter,
            seed=seed,
            lease_id_base=int.from_bytes(os.urandom(_LEASE_ID_BASE_BITS // 8), "little") << 16,
        )
        self._funcs: dict[bytes, bytes] = {}
        self._results: list[ResultRecord] = []  # records not yet fetched
        self._results_base = 0  # cursor of self._results[0]
        self._closed = False
        self._get_calls = 0
        self._ready_event: asyncio.Event | None = None
        self._outcome_event: asyncio.Event | None = None
        self._timer_changed: asyncio.Event | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._sweep_at: float | None = None
        self._paused: asyncio.Event | None = None  # set when the paused work has finished

    def __repr__(self) -> str:
        s = self._core.stats()
        return f"<{type(self).__name__} {self.index}: ready={s.ready} leased={s.leased} dead={s.dead}>"

    # -- clock and background work ------------------------------------------------------------

    @staticmethod
    def _now() -> float:
        return time.monotonic()

    def _start(self) -> None:
        """Create the events and the sweeper on first use (``__init__`` runs off the loop)."""
        if self._closed:
            raise QueueClosedError(f"queue {self.index} is closed")
        if self._sweeper is None:
            self._ready_event = asyncio.Event()
            self._outcome_event = asyncio.Event()
            self._timer_changed = asyncio.Event()
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        """Expire leases and promote delayed messages when they fall due; sleep otherwise.

        Passes the gate after each ``await``: a compaction may have begun meanwhile.
        """
        while True:
            await self._unpaused()
            if self._closed:
                return
            await self._sleep_until_due()
            await self._unpaused()
            if self._closed:
                return
            await self._sweep_once(self._now())

    async def _sleep_until_due(self) -> None:
        """Until the next lease deadline, delayed message or housekeeping, or a wakeup."""
        assert self._timer_changed is not None
        wakeup = self._core.next_wakeup()
        self._sweep_at = wakeup
        timeout = None if wakeup is None else max(0.0, wakeup - self._now()) + defaults.DUE_WAKEUP_MARGIN_S
        chore = self._housekeeping_due_in()
        if chore is not None:
            timeout = chore if timeout is None else min(timeout, chore)
        self._timer_changed.clear()
        try:
            await asyncio.wait_for(self._timer_changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def _sweep_once(self, now: float) -> None:
        """One wakeup's work: expire, persist, wake getters, then housekeeping, last because
        it may pause the queue."""
        expired = self._core.expire(now=now)
        if expired:
            logger.info("queue %d: %d leased messages expired; redelivering", self.index, expired)
            self._notify_outcomes()  # some may have been dead-lettered
        try:
            self._after_change(now)
        except Exception:
            logger.exception("queue %d: storage housekeeping failed", self.index)
        if self._core.has_ready(now):
            self._notify_ready()
        try:
            await self._housekeeping()
        except Exception:
            logger.exception("queue %d: storage housekeeping failed", self.index)

    # -- pausing the queue for work off the loop --------------------------------------------

    async def _unpaused(self) -> None:
        """The gate: return once no paused work runs. Every method calls it before it reads or
        changes state, and again after any ``await`` that may have let a pause begin.

        The data plane checks ``self._paused is not None`` before calling it, so the gate
        costs one attribute check when nothing is paused (always, in a transient queue).
        """
        while self._paused is not None:
            await self._paused.wait()

    async def _run_paused(self, work: Callable[[], T]) -> T:
        """Run ``work()`` on a thread of its own while every other call waits at the gate.

        ``work`` may touch every piece of the queue's state; nothing on the loop does until it
        has returned. The pause ends when the thread does, even if the caller is cancelled
        meanwhile (the future is shielded; its done-callback ends the pause). The thread is
        started here and ends with ``work``: nobody has to stop it. One runs at a time.
        """
        await self._unpaused()
        done = self._paused = asyncio.Event()
        executor = ThreadPoolExecutor(1, thread_name_prefix=f"daskqueue-{self.index}-paused")
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, work)
        except BaseException:
            self._resume(done)
            raise
        finally:
            executor.shutdown(wait=False)  # the thread exits once ``work`` returns
        future.add_done_callback(lambda _: self._resume(done))
        return await asyncio.shield(future)

    def _resume(self, done: asyncio.Event) -> None:
        self._paused = None
        done.set()

    def _reschedule(self) -> None:
        """Wake the sweeper if something now falls due before its planned wakeup."""
        wakeup = self._core.next_wakeup()
        if wakeup is not None and (self._sweep_at is None or wakeup < self._sweep_at):
            self._sweep_at = wakeup
            assert self._timer_changed is not None
            self._timer_changed.set()

    def _wake_sweeper(self) -> None:
        """Make the sweeper recompute its wakeup (new housekeeping may be due sooner)."""
        if self._timer_changed is not None:
            self._timer_changed.set()

    def _notify_outcomes(self) -> None:
        """Wake ``fetch_outcomes`` waiters: new results or dead letters are here."""
        if self._outcome_event is not None:
            self._outcome_event.set()
            self._outcome_event = asyncio.Event()

    def _notify_ready(self) -> None:
        # Waiters hold the old event; new waiters get a fresh one.
        assert self._ready_event is not None
        self._ready_event.set()
        self._ready_event = asyncio.Event()

    # -- storage hooks (no-ops in memory) -------------------------------------------------------

    def _fit_groups(self, groups: list[Any]) -> list[Any]:
        """Split put groups that storage cannot hold in one record (identity in memory)."""
        return groups

    def _on_put(self, chunks: list[tuple[Chunk, float]], funcs: dict[bytes, bytes], now: float) -> None:
        """Persist freshly put chunks (and new functions) before the put is answered."""

    def _after_change(self, now: float) -> None:
        """Persist the core's journalled transitions before the call is answered."""

    def _add_result(self, record: ResultRecord) -> None:
        self._results.append(record)

    def _drop_results(self, n: int) -> None:
        del self._results[:n]
        self._results_base += n

    def _housekeeping_due_in(self) -> float | None:
        """Seconds until ``_housekeeping`` should run (None: nothing scheduled)."""
        return None

    async def _housekeeping(self) -> None:
        """Periodic storage work (interval syncs, compaction), run by the sweeper."""

    def _close_storage(self) -> None:
        """Release storage on close."""

    # -- the data plane -----------------------------------------------------------------------

    async def put_batch(self, blob: bytes) -> list[tuple[int, int]]:
        """Enqueue a put blob; return ``(first_seq, count)`` per group of the blob, in order.

        A group that storage splits into several chunks still gets one range: its chunks are
        made one after the other, so their sequence numbers are consecutive.
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        funcs, groups = decode_put(blob)
        for g in groups:
            self._check_sizes(g.offsets)
        now = self._now()
        chunks = []
        ranges = []
        for group in groups:
            first = None
            for g in self._fit_groups([group]):
                offsets = array("I")
                offsets.frombytes(g.offsets)
                chunk = self._core.new_chunk(
                    g.count, priority=g.priority, payload=ChunkPayload(offsets, g.data), meta=g.meta()
                )
                chunks.append((chunk, g.delay_s))
                first = chunk.base_seq if first is None else first
            ranges.append((first, group.count))
        new_funcs = {d: b for d, b in funcs.items() if d not in self._funcs}
        self._on_put(chunks, new_funcs, now)  # raises (and nothing is enqueued) if storage fails
        self._funcs.update(new_funcs)
        for chunk, delay_s in chunks:
            self._core.put(chunk, now=now, not_before=now + delay_s if delay_s > 0 else None)
        if any(d > 0 for _, d in chunks):
            self._reschedule()
        self._notify_ready()
        return ranges

    def _check_sizes(self, offsets_bytes: bytes) -> None:
        offs = array("I")
        offs.frombytes(offsets_bytes)
        if len(offs) and offs[-1] - offs[0] > self.max_message_bytes:
            biggest = max(b - a for a, b in zip(offs, offs[1:]))
            if biggest > self.max_message_bytes:
                raise PayloadTooLargeError(biggest, self.max_message_bytes)

    async def get_batch(self, max_items: int, wait_s: float = 0.0, owner: str | None = None) -> bytes | None:
        """Lease up to ``max_items`` messages; wait up to ``wait_s`` for one to be ready.

        Returns a delivery blob, or ``None`` if nothing became ready in time (or the queue was
        closed while waiting). Waiting awaits an event set by puts and redeliveries: an idle
        caller costs one call per ``wait_s``. ``owner`` (the caller's worker address) lets
        :meth:`workers_lost` take the lease back if that worker dies.
        """
        self._start()
        self._get_calls += 1
        deadline = self._now() + wait_s
        while True:
            if self._paused is not None:  # the gate, at the start and after every wait
                await self._unpaused()
            if self._closed:
                return None
            now = self._now()
            lease = self._core.get_batch(max_items, now=now, owner=owner)
            if lease is not None:
                self._persist_lease(lease, now)
                self._reschedule()
                return self._encode(lease)
            remaining = deadline - now
            if remaining <= 0 or self._closed:
                return None
            assert self._ready_event is not None
            try:
                await asyncio.wait_for(self._ready_event.wait(), remaining)
            except asyncio.TimeoutError:
                return None

    def _persist_lease(self, lease: Lease, now: float) -> None:
        """Persist a new lease; if storage refuses, give its messages back and raise.

        Released, they are ready again at once (attempts unchanged), not leased to nobody
        until the lease expires. The journal keeps the lease and its release, in order, for
        the next write that succeeds.
        """
        try:
            self._after_change(now)
        except BaseException:
            self._core.settle(lease.lease_id, done=0, now=now)
            self._notify_ready()
            raise

    async def workers_lost(self, addresses: list[str]) -> int:
        """These workers died: take back at once every lease their consumers held (an
        attempt each, see ``QueueCore.take_back``); return how many messages."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        now = self._now()
        error = killed_error(f"the worker running this message died ({', '.join(sorted(addresses))})")
        n = self._core.take_back(frozenset(addresses), error, now=now)
        if n:
            logger.warning("queue %d: %d leased messages taken back from consumers on lost "
                           "workers %s", self.index, n, addresses)
            self._notify_outcomes()  # some may have been dead-lettered
            self._reschedule()
            self._after_change(now)
        return n

    async def get_batch_nowait(self, max_items: int) -> bytes:
        """Like ``get_batch`` without waiting; raises :class:`QueueEmpty` if nothing is ready."""
        blob = await self.get_batch(max_items, 0.0)
        if blob is None:
            raise QueueEmpty(f"queue {self.index} has no ready message")
        return blob

    def _encode(self, lease: Lease) -> bytes:
        return encode_delivery(lease.lease_id, self.index, [_segment(span) for span in lease.spans])

    async def settle(self, lease_id: int, blob: bytes) -> tuple[int, int, int, int]:
        """Ack/nack a lease: ``blob`` says how many ran, which failed, and their results.

        Returns ``(acked, retried, dead, released)``. Raises :class:`LeaseExpiredError` if the
        lease expired before this call: its messages were redelivered, and this outcome is
        dropped so that each message has exactly one recorded outcome.
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        lease = self._core.lease(lease_id)
        if lease is None:
            raise LeaseExpiredError(lease_id)
        done, errors, fatal, results = decode_settle(blob)
        now = self._now()
        # Check, then store the results, then settle: if storage refuses the results, the
        # lease is still held and nothing is acked without its result.
        self._core.check_settlement(lease_id, done=done, errors=errors, fatal=fatal)
        if results is not None and done:
            ranges = _ran_ranges(lease, done)
            self._add_result(ResultRecord(self.index, ranges, sorted(errors), results, None))
        s = self._core.settle(lease_id, done=done, errors=errors, fatal=fatal, now=now)
        try:
            self._after_change(now)
        finally:  # it took effect even if storage failed: wake whoever it concerns
            self._announce(s)
        return s.n_acked, s.n_retried, s.n_dead, s.n_released

    def _announce(self, s: Settlement) -> None:
        """Wake the sweeper for retries, getters for released messages, outcome waiters."""
        if s.n_retried:
            self._reschedule()
        if s.n_released:
            self._notify_ready()
        self._notify_outcomes()

    async def record_outcomes(self, ranges: list[tuple[int, int]], errors: dict[int, bytes], results: bytes) -> None:
        """Store the outcomes of early-acked messages (already settled; failures are final)."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        self._add_result(ResultRecord(self.index, ranges, sorted(errors), results, errors))
        try:
            self._after_change(self._now())
        finally:  # the results are kept even if storage failed (see DurableQueue)
            self._notify_outcomes()

    async def extend(self, lease_ids: list[int]) -> list[int]:
        """Extend live leases by ``lease_timeout_s`` from now; return the ids no longer held."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        return self._core.extend(lease_ids, now=self._now())

    # -- functions, results, dead letters -----------------------------------------------------

    async def get_functions(self, digests: list[bytes]) -> dict[bytes, bytes]:
        """The pickled functions with these digests (those this queue knows)."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        return {d: self._funcs[d] for d in digests if d in self._funcs}

    async def fetch_results(self, cursor: int) -> tuple[int, bytes]:
        """Records from ``cursor`` on, and the next cursor; drops the records before ``cursor``.

        The records are a pickled list of :class:`~daskqueue.serialize.ResultRecord`; its
        ``final_errors`` are failures of early-acked messages (late-acked failures are retried
        and reach ``fetch_dead`` instead).
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        drop = max(0, min(cursor - self._results_base, len(self._results)))
        if drop:
            self._drop_results(drop)
        end = self._results_base + len(self._results)
        return end, pickle.dumps(self._results, PROTOCOL)

    async def fetch_outcomes(
        self, cursor: int, dead_cursor: int, wait_s: float = 0.0
    ) -> tuple[int, bytes, int, list[tuple[int, int, bytes, Any]]]:
        """``fetch_results`` and ``fetch_dead`` in one call; if neither has anything new,
        wait up to ``wait_s`` for an outcome to arrive (a long poll, not a loop)."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        end = self._results_base + len(self._results)
        if wait_s > 0 and cursor >= end and dead_cursor >= len(self._core.dead):
            assert self._outcome_event is not None
            try:
                await asyncio.wait_for(self._outcome_event.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        # Both wait at the gate again; neither yields to the loop once past it.
        cursor, blob = await self.fetch_results(cursor)
        dead_cursor, dead = await self.fetch_dead(dead_cursor)
        return cursor, blob, dead_cursor, dead

    async def fetch_dead(self, cursor: int) -> tuple[int, list[tuple[int, int, bytes, Any]]]:
        """Dead letters from index ``cursor`` on: ``(seq, attempts, error, meta)`` each."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        dead = self._core.dead[cursor:]
        return cursor + len(dead), [(d.seq, d.attempts, d.error, d.chunk.meta) for d in dead]

    async def stats(self) -> QueueStats:
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        s = self._core.stats()
        return QueueStats(
            index=self.index,
            kind=self.kind,
            ready=s.ready,
            delayed=s.delayed,
            leased=s.leased,
            dead=s.dead,
            total_put=s.total_put,
            total_acked=s.total_acked,
            total_retried=s.total_retried,
            total_expired=s.total_expired,
            total_worker_lost=s.total_taken_back,
            get_calls=self._get_calls,
            closed=self._closed,
        )

    async def close(self) -> None:
        """Refuse further calls, wake every waiter, stop the sweeper, wait for paused work to
        finish, then close storage. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            assert self._timer_changed is not None
            self._timer_changed.set()
            self._notify_ready()
            self._notify_outcomes()
            await self._sweeper  # it finishes a compaction it runs before it returns
            self._sweeper = None
        await self._unpaused()  # a compaction run by compact() still owns the storage
        self._close_storage()


def _segment(span: Span) -> Segment:
    """The delivery segment of a leased span: its offsets and its slice of the payloads."""
    payload, meta = span.chunk.payload, span.chunk.meta
    offs = payload.offsets[span.start : span.stop + 1]
    return Segment(
        span.first_seq, span.count, span.attempts, meta.kind, meta.digest, meta.type,
        span.chunk.priority, meta.key, offs.tobytes(), payload.data[offs[0] : offs[-1]],
    )


def _ran_ranges(lease: Lease, done: int) -> list[tuple[int, int]]:
    """``(first_seq, count)`` of the first ``done`` messages of ``lease``, in order."""
    ranges = []
    left = done
    for span in lease.spans:
        if left <= 0:
            break
        n = min(span.count, left)
        ranges.append((span.first_seq, n))
        left -= n
    return ranges
