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
import itertools
import logging
import os
import pickle
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from daskqueue import defaults, metrics
from daskqueue.errors import (
    LeaseExpiredError,
    PayloadTooLargeError,
    QueueClosedError,
    QueueEmpty,
    QueueHandedOffError,
)
from daskqueue.messages import killed_error
from daskqueue.queue.core import Chunk, CoreStats, Lease, QueueCore, Settlement, Span
from daskqueue.queue.policy import FIFO, TypePolicy
from daskqueue.queue.ring import HashRing
from daskqueue.membership import LOAD_TOPIC
from daskqueue.queue.handles import ORPHAN_CHECK_S, released_actor
from daskqueue.segment.format import TOKEN_SIZE
from daskqueue.serialize import (
    PROTOCOL,
    Group,
    ResultRecord,
    Segment,
    decode_put,
    decode_settle,
    encode_delivery,
    encode_put,
)

__all__ = ["QueueActorBase", "QueueStats", "ChunkPayload", "TOKENS_KEPT", "detach_payload"]

logger = logging.getLogger("daskqueue")

T = TypeVar("T")

#: Lease ids of a queue actor start at a random 48-bit number shifted by 16 bits: a reopened
#: durable queue never reuses the ids its previous incarnation handed out.
_LEASE_ID_BASE_BITS = 48

#: How many recent put tokens a queue remembers, to answer a retried put (one whose answer
#: was lost when the queue moved) with the ids it already got instead of storing it again.
TOKENS_KEPT = 10_000

#: How often a queue with work reports its load to the scheduler (for ``adapt()``).
LOAD_REPORT_S = 1.0

#: What a queue has told its peers before it told them anything (equal to no priority).
_UNTOLD = object()

#: At most this often a queue tells its peers that it now has ready messages, or has none.
WORK_ANNOUNCE_S = 0.02

#: How often a queue with fenced keys asks the queues they moved from whether those still
#: hold a message of theirs.
FENCE_CHECK_S = 0.1


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
    total_moved: int = 0  # handed to another queue by add_queues / remove_queue

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
        pool: str | None = None,
        policy: TypePolicy = FIFO,
    ) -> None:
        self.index = index
        self.pool = pool
        self.max_message_bytes = max_message_bytes
        self._core = QueueCore(
            lease_timeout_s=lease_timeout_s,
            max_retries=max_retries,
            retry_backoff_base_s=retry_backoff_base_s,
            retry_backoff_max_s=retry_backoff_max_s,
            retry_backoff_jitter=retry_backoff_jitter,
            seed=seed,
            lease_id_base=int.from_bytes(os.urandom(_LEASE_ID_BASE_BITS // 8), "little") << 16,
            policy=policy,
        )
        self._core.detach = detach_payload
        # Typed pools (fair / capped): slots per consumer pool, the peer queues, and their
        # latest counts per type, ``index -> (monotonic time, {type: (ready, running)})``.
        self._slots: dict[str, int] = {}
        self._peers: dict[int, Any] = {}  # queue index -> handle, every other queue of the pool
        # Work announcements: which peers said they have ready messages (what a consumer's
        # long poll of its home queue hears about, instead of asking every queue in turn),
        # and what this queue last told them.
        # peer index -> (the number of its announcement, its top ready priority)
        self._work_at: dict[int, tuple[int, int]] = {}
        self._heard: dict[int, int] = {}  # peer index -> the number of its latest announcement
        self._went_empty = False
        self._announced: Any = _UNTOLD  # the top priority last told the peers (None: no work)
        self._announcements = 0
        self._getters = 0  # calls waiting in get_batch: this queue's own idle consumers
        self._announcer: asyncio.Task[None] | None = None
        self._announced_at = 0.0
        self._peer_reports: dict[int, tuple[float, dict[Any, tuple[int, int]]]] = {}
        self._gossip: asyncio.Task[None] | None = None
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
        self._handed_off = False  # its state went to a successor actor: it serves no more
        self._tokens: dict[bytes, tuple[int, int]] = {}  # put token -> (first seq, count)
        self._task_s: float | None = None  # measured seconds per message, lease to settle
        self._reported_at = 0.0  # when the load was last reported to the scheduler
        self._reported_work = False  # whether that report had work in it
        self._checked_at = 0.0  # when the sweeper last checked that its worker holds it
        self._orphan_close: asyncio.Task[None] | None = None
        # Keys moved here while one of their messages ran in the queue they came from:
        # source queue index -> keys, fenced in the core until the source has none left.
        self._fences: dict[int, set[str]] = {}
        self._fence_checker: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        s = self._core.stats()
        return f"<{type(self).__name__} {self.index}: ready={s.ready} leased={s.leased} dead={s.dead}>"

    # -- clock and background work ------------------------------------------------------------

    @staticmethod
    def _now() -> float:
        return time.monotonic()

    def _start(self) -> None:
        """Create the events and the sweeper on first use (``__init__`` runs off the loop)."""
        self._check_serving()
        if self._sweeper is None:
            self._ready_event = asyncio.Event()
            self._outcome_event = asyncio.Event()
            self._timer_changed = asyncio.Event()
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
            if self._core.policy.typed:
                self._gossip = asyncio.get_running_loop().create_task(self._gossip_forever())
            self._check_fences_soon()  # fences handed over by a predecessor
            metrics.ensure_registered()  # this worker's /metrics shows its queues

    def _check_serving(self) -> None:
        if self._handed_off:
            raise QueueHandedOffError(self.index, _here())
        if self._closed:
            raise QueueClosedError(f"queue {self.index} is closed")

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
            if self._orphaned():
                return
            await self._sweep_once(self._now())

    def _orphaned(self) -> bool:
        """Every ``ORPHAN_CHECK_S``: if the worker released this actor (its pool's client is
        gone), close it (on a task of its own: ``close`` awaits this sweeper), so that its
        directory's lock is free for the next pool. Returns whether it did."""
        now = time.monotonic()
        if now - self._checked_at < ORPHAN_CHECK_S:
            return False
        self._checked_at = now
        if not released_actor(self):
            return False
        logger.warning("queue %d: its pool's client is gone (the worker released the actor); "
                       "closing it", self.index)
        # Held here, not awaited: nobody is left to await it; it ends when close() does.
        self._orphan_close = asyncio.get_running_loop().create_task(self.close())
        return True

    async def _sleep_until_due(self) -> None:
        """Until the next lease deadline, delayed message or housekeeping, or a wakeup."""
        assert self._timer_changed is not None
        wakeup = self._core.next_wakeup()
        self._sweep_at = wakeup
        timeout = None if wakeup is None else max(0.0, wakeup - self._now()) + defaults.DUE_WAKEUP_MARGIN_S
        orphan_check = max(0.0, self._checked_at + ORPHAN_CHECK_S - time.monotonic())
        for chore in (self._housekeeping_due_in(), self._report_due_in(), orphan_check):
            if chore is not None:
                timeout = chore if timeout is None else min(timeout, chore)
        self._timer_changed.clear()
        # asyncio.wait, not wait_for: on Python 3.11 a wait_for cancelled just as its inner
        # wait finishes returns instead of raising, and a cancelled sweeper would run on.
        waiter = asyncio.ensure_future(self._timer_changed.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()

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
        self._work_changed()
        due = self._report_due_in()
        if due is not None and due <= 0:
            self._report_load()
        try:
            await self._housekeeping()
        except Exception:
            logger.exception("queue %d: storage housekeeping failed", self.index)

    # -- load reports (what makes ``adapt()`` see the backlog) --------------------------------

    def _report_due_in(self) -> float | None:
        """Seconds until the next load report: every ``LOAD_REPORT_S`` while the queue has
        work, and once more when it has none left; None when idle and reported so."""
        if self.pool is None:
            return None
        s = self._core.stats()
        if not (s.pending or self._reported_work):
            return None
        return max(0.0, self._reported_at + LOAD_REPORT_S - time.monotonic())

    def _report_load(self, *, closing: bool = False) -> None:
        """Tell the scheduler this queue's backlog (``daskqueue.membership`` adds it to the
        scheduler's adaptive target): messages waiting or running and seconds per message.
        A closing queue reports none."""
        s = self._core.stats() if not closing else CoreStats(0, 0, 0, 0, 0, 0, 0, 0, 0)
        self._reported_at = time.monotonic()
        self._reported_work = bool(s.pending)
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):  # not on a worker (a queue driven by hand in tests)
            return
        worker.log_event(LOAD_TOPIC, {"pool": self.pool, "queue": self.index, "ready": s.ready,
                                      "delayed": s.delayed, "leased": s.leased, "task_s": self._task_s})

    def _measure(self, lease: Lease, done: int, now: float) -> None:
        """Seconds per message from a settled lease (lease to settle: running and the wait
        in the consumer's prefetch, an overestimate by at most one batch)."""
        if done > 0:
            per = max(0.0, now - lease.started) / done
            self._task_s = per if self._task_s is None else 0.8 * self._task_s + 0.2 * per

    # -- typed pools: slots and the peers' counts (see daskqueue.queue.policy) ----------------

    async def set_slots(self, owner: str, slots: int) -> None:
        """Consumer pool ``owner`` runs ``slots`` batches at once (0: it stopped); the pool's
        slots are the sum, what fair shares are taken of."""
        if slots > 0:
            self._slots[owner] = slots
        else:
            self._slots.pop(owner, None)
        self._core.slots = sum(self._slots.values())
        if self._ready_event is not None:
            self._notify_ready()

    async def set_peers(self, refs: list[Any]) -> None:
        """The pool's queues (``queue_ref`` tuples, by index), which this one tells whether
        it has work (and, in a typed pool, its counts per type). Sent again after a queue
        moves: this one then tells them all its state afresh."""
        from daskqueue.consumer.base import _bind_local
        from daskqueue.queue.handles import worker_handle

        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        # Starts the sweeper too: it closes this actor if its pool's client dies before any
        # other call came (a durable queue would keep its directory locked otherwise).
        self._start()
        self._peers = {i: _bind_local(worker_handle(r)) for i, r in enumerate(refs)
                       if i != self.index and r is not None}
        self._work_at = {i: v for i, v in self._work_at.items() if i in self._peers}
        self._announced = _UNTOLD  # tell them the current state afresh
        self._work_changed()

    async def work_at(self, index: int, top_priority: int | None, number: int = 0) -> None:
        """Queue ``index`` of the pool has ready messages now, the highest of priority
        ``top_priority`` (None: it has none left), said in its announcement ``number`` (a
        consumer that found the queue empty after all ignores that announcement, not the
        next one)."""
        if number and number < self._heard.get(index, 0):
            return  # an older announcement arriving late
        self._heard[index] = number
        if top_priority is not None:
            self._work_at[index] = (number, top_priority)
            if self._ready_event is not None:
                self._notify_ready()  # a consumer idle on this queue may go there
        else:
            self._work_at.pop(index, None)

    def _work_changed(self) -> None:
        """After anything that may change whether this queue has ready messages: tell the
        peers when it did, at most every ``WORK_ANNOUNCE_S`` (the latest state goes out)."""
        if not self._peers or self._closed:
            return
        top = self._work_for_others()
        if top is None and self._announced not in (None, _UNTOLD):
            self._went_empty = True  # work told of is gone: new work needs a new announcement
        if self._announcer is not None or not self._news(top):
            return
        self._announcer = asyncio.get_running_loop().create_task(self._announce_work())

    def _news(self, top: int | None) -> bool:
        """Whether ``top`` is not what the peers were told, or is new work since then."""
        return top != self._announced or (top is not None and self._went_empty)

    async def _announce_work(self) -> None:
        try:
            wait = self._announced_at + WORK_ANNOUNCE_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            top = self._work_for_others()
            if not self._news(top):
                return
            self._announced, self._announced_at, self._went_empty = top, time.monotonic(), False
            self._announcements += 1
            await self._tell_peers("work_at", self.index, top, self._announcements)
        finally:
            self._announcer = None
        if self._news(self._work_for_others()) and not self._closed:
            self._work_changed()  # it changed again meanwhile

    def _work_for_others(self) -> int | None:
        """The top priority of ready messages that no call waiting here will take (None if
        none): while this queue's own consumers wait on it, a put is theirs, and waking every
        idle consumer of the pool for it would only make them race for one message."""
        return None if self._getters else self._core.top_priority

    async def peer_counts(self, index: int, counts: dict[Any, tuple[int, int]]) -> None:
        """Queue ``index`` of the pool has these ready messages and running batches per type."""
        self._peer_reports[index] = (time.monotonic(), counts)
        if self._ready_event is not None:
            self._notify_ready()  # a peer's slot may have freed: waiting getters look again

    def _count_peers(self) -> None:
        """Sum the fresh peer reports into the core's view of the rest of the pool."""
        fresh_after = time.monotonic() - defaults.TYPE_GOSSIP_STALE_S
        ready: dict[Any, int] = {}
        running: dict[Any, int] = {}
        for index, (at, counts) in list(self._peer_reports.items()):
            if at < fresh_after or index == self.index:
                del self._peer_reports[index]
                continue
            for t, (r, n) in counts.items():
                ready[t] = ready.get(t, 0) + r
                running[t] = running.get(t, 0) + n
        self._core.peer_ready, self._core.peer_running = ready, running

    async def _gossip_forever(self) -> None:
        """Tell the peers this queue's counts per type when they change (at most every
        ``TYPE_GOSSIP_S``), and every second regardless so that they know it is alive. A
        peer that does not answer is skipped; its own report goes stale meanwhile."""
        last: dict[Any, tuple[int, int]] | None = None
        sent_at = 0.0
        while True:
            await asyncio.sleep(defaults.TYPE_GOSSIP_S)
            counts = self._core.type_counts()
            if not self._peers or (counts == last and time.monotonic() - sent_at < 1.0):
                continue
            last, sent_at = counts, time.monotonic()
            await self._tell_peers("peer_counts", self.index, counts)

    async def _tell_peers(self, method: str, *args: Any) -> None:
        """Call ``method(*args)`` on every peer at once, waiting at most a second: a peer
        that does not answer is skipped (what it misses goes stale, see its readers)."""
        calls = [asyncio.ensure_future(getattr(p, method)(*args)) for p in self._peers.values()]
        if not calls:
            return
        done, pending = await asyncio.wait(calls, timeout=defaults.TYPE_GOSSIP_STALE_S / 3)
        for call in pending:
            call.cancel()
        for call in done:
            if not call.cancelled() and call.exception() is not None:
                logger.debug("queue %d: a peer did not take %s: %s", self.index, method, call.exception())

    # -- moving messages to other queues (queues added to or removed from the pool) -----------

    async def move_out(self, nodes: list[int], typed: bool = False,
                       everything: bool = False) -> tuple[list[tuple[int, int, int, int]], list[str]]:
        """Hand the waiting messages that the pool's new ring of queues ``nodes`` routes
        elsewhere to those queues (peers of this one), each in put order: keyed messages by
        their key, every message by its type in a typed pool, and with ``everything`` (this
        queue is being removed) the unkeyed ones too, spread over the others in turn. A key
        whose message runs here (or waits for its retry) keeps that message here, and its new
        queue fences the key until this queue holds none of its messages.

        Each destination stores the messages before they leave here (a mover lease holds them
        meanwhile): a failure or a crash may deliver a message twice, never lose it. Returns
        ``(old first seq, count, new queue, new first seq)`` per moved run (the client reports
        their outcomes under their old ids) and the errors of the destinations that did not
        take theirs (those messages stay here, in their places).
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        ring = HashRing(nodes)
        others = [n for n in nodes if n != self.index and n in self._peers]
        turn = itertools.count()

        def dest(chunk: Chunk) -> int | None:
            if typed:
                d = ring.node(chunk.type)
            elif chunk.key is not None:
                d = ring.node(chunk.key)
            elif everything and others:
                d = others[next(turn) % len(others)]
            else:
                return None
            return d if d != self.index and d in self._peers else None

        now = self._now()
        leases, delays, fences = self._core.take_moving(dest, now=now)
        if not leases:
            return [], []
        try:
            self._after_change(now)
        except BaseException:
            for d, lease in leases.items():
                self._core.return_moved(lease.lease_id, delays[d], now=now)
            raise
        calls = {}
        for d, lease in leases.items():
            groups = [_moved_group(span, delay) for span, delay in zip(lease.spans, delays[d])]
            funcs = {g.digest: self._funcs[g.digest] for g in groups if g.digest is not None}
            calls[d] = asyncio.ensure_future(
                self._peers[d].adopt(encode_put(groups, funcs), os.urandom(TOKEN_SIZE), sorted(fences[d]), self.index)
            )
        await asyncio.wait(calls.values(), timeout=defaults.CONTROL_CALL_TIMEOUT_S)
        if self._paused is not None:  # a compaction may have begun meanwhile
            await self._unpaused()
        moved: list[tuple[int, int, int, int]] = []
        failed: list[str] = []
        now = self._now()
        for d, call in calls.items():
            lease = leases[d]
            if self._core.lease(lease.lease_id) is None:  # taken back meanwhile (cannot expire)
                continue
            if call.done() and not call.cancelled() and call.exception() is None:
                for span, (first, _) in zip(lease.spans, call.result()):
                    moved.append((span.first_seq, span.count, d, first))
                self._core.drop_moved(lease.lease_id)
                continue
            call.cancel()
            error = "no answer in time" if not call.done() or call.cancelled() else repr(call.exception())
            failed.append(f"queue {d}: {error}")
            self._core.return_moved(lease.lease_id, delays[d], now=now)  # back in their places
        try:
            self._after_change(now)
        finally:
            self._notify_ready()
            self._work_changed()
        if moved:
            logger.info("queue %d: %d messages moved to queues %s", self.index,
                        sum(m[1] for m in moved), sorted({m[2] for m in moved}))
        return moved, failed

    async def adopt(self, blob: bytes, token: bytes, fenced: list[str], source: int) -> list[tuple[int, int]]:
        """``put_batch`` of messages that queue ``source`` moves here; the ``fenced`` keys
        run here only once ``source`` holds none of their messages (one of theirs still runs
        there)."""
        if fenced:
            self._check_serving()
            self._core.fence(fenced)
            self._fences.setdefault(source, set()).update(fenced)
            self._check_fences_soon()
        return await self.put_batch(blob, token)

    async def holds_keys(self, keys: list[str]) -> list[str]:
        """Those of ``keys`` that a message in this queue still has (running, waiting)."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._check_serving()
        return sorted(self._core.keys_present(set(keys)))

    def _check_fences_soon(self) -> None:
        if self._fence_checker is None and self._fences and not self._closed:
            self._fence_checker = asyncio.get_running_loop().create_task(self._check_fences())

    async def _check_fences(self) -> None:
        """Every ``FENCE_CHECK_S`` while keys are fenced: ask their source queues which of
        them they still hold, and unfence the others. A source that was removed, or lost
        with its worker (a transient queue's messages went with it), holds none; a durable
        one that is being reopened elsewhere is asked again once the pool says where."""
        try:
            while self._fences and not self._closed:
                await asyncio.sleep(FENCE_CHECK_S)
                for source, keys in list(self._fences.items()):
                    peer = self._peers.get(source)
                    asked = set(keys)  # adopt may add keys while the answer is awaited
                    try:
                        held = set() if peer is None else set(await asyncio.wait_for(
                            peer.holds_keys(sorted(asked)), defaults.CONTROL_CALL_TIMEOUT_S))
                    except (QueueHandedOffError, asyncio.TimeoutError):
                        continue
                    except Exception as e:
                        if self.kind == "durable" and not isinstance(e, QueueClosedError):
                            continue  # reopened elsewhere, with the key's message: ask there
                        logger.info("queue %d: queue %d is gone (%s); unfencing its keys", self.index, source, e)
                        held = set()
                    if self._paused is not None:
                        await self._unpaused()
                    free = asked - held
                    if free:
                        self._core.unfence(free)
                        keys -= free
                        if not keys:
                            del self._fences[source]
                        self._notify_ready()
                        self._work_changed()
        finally:
            self._fence_checker = None

    # -- handing the queue to a successor (graceful retirement of its worker) -----------------

    async def hand_off(self) -> bytes:
        """Stop serving and return what a successor needs to go on where this one stops
        (a pickled dict; ``_import_handoff`` of the same class takes it).

        Every call from now on raises :class:`QueueHandedOffError` (nothing of it done: the
        caller repeats it at the successor); waiters are woken; a compaction running now
        finishes first. The state is read after the sweeper has stopped, so it is complete.
        """
        self._check_serving()
        self._handed_off = True
        await self.close()
        return pickle.dumps(self._export_handoff(self._now()), PROTOCOL)

    def _export_handoff(self, now: float) -> dict[str, Any]:
        """The whole state (in memory, the only copy): messages, leases, dead letters,
        results not fetched, functions, put tokens."""
        return {
            "core": self._core.export_state(now=now),
            "funcs": self._funcs,
            "results": self._results,
            "results_base": self._results_base,
            "tokens": self._tokens,
            "get_calls": self._get_calls,
            "task_s": self._task_s,
            "fences": self._fences,
        }

    def _import_handoff(self, state: dict[str, Any]) -> None:
        self._core.import_state(state["core"], now=self._now())
        self._funcs = state["funcs"]
        self._results = state["results"]
        self._results_base = state["results_base"]
        self._tokens = state["tokens"]
        self._get_calls = state["get_calls"]
        self._task_s = state["task_s"]
        self._fences = state["fences"]

    def _remember_token(self, token: bytes | None, ranges: list[tuple[int, int]]) -> None:
        if token is None or not ranges:
            return
        self._tokens[token] = (ranges[0][0], sum(n for _, n in ranges))
        if len(self._tokens) > TOKENS_KEPT:  # dicts keep insertion order: drop the oldest
            del self._tokens[next(iter(self._tokens))]

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

    def _on_put(self, chunks: list[tuple[Chunk, float]], funcs: dict[bytes, bytes], now: float,
                token: bytes | None, ranges: list[tuple[int, int]]) -> None:
        """Persist freshly put chunks (new functions, the put's token) before it is answered."""

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

    async def put_batch(self, blob: bytes, token: bytes | None = None) -> list[tuple[int, int]]:
        """Enqueue a put blob; return ``(first_seq, count)`` per group of the blob, in order.

        A group that storage splits into several chunks still gets one range: its chunks are
        made one after the other, so their sequence numbers are consecutive. A put with the
        ``token`` of a put this queue stored already (a retry whose first answer was lost)
        stores nothing and gets the first one's answer.
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        funcs, groups = decode_put(blob)
        if token is not None and token in self._tokens:
            return _ranges_of(self._tokens[token], groups)
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
                    g.count, priority=g.priority, payload=ChunkPayload(offsets, g.data), meta=g.meta(),
                    type=g.type, key=g.key,
                )
                chunks.append((chunk, g.delay_now()))
                first = chunk.base_seq if first is None else first
            ranges.append((first, group.count))
        new_funcs = {d: b for d, b in funcs.items() if d not in self._funcs}
        self._on_put(chunks, new_funcs, now, token, ranges)  # raises (nothing enqueued) if storage fails
        self._remember_token(token, ranges)
        self._funcs.update(new_funcs)
        for chunk, delay_s in chunks:
            self._core.put(chunk, now=now, not_before=now + delay_s if delay_s > 0 else None)
        if any(d > 0 for _, d in chunks):
            self._reschedule()
        self._notify_ready()
        self._work_changed()
        return ranges

    def _check_sizes(self, offsets_bytes: bytes) -> None:
        offs = array("I")
        offs.frombytes(offsets_bytes)
        if len(offs) and offs[-1] - offs[0] > self.max_message_bytes:
            biggest = max(b - a for a, b in zip(offs, offs[1:]))
            if biggest > self.max_message_bytes:
                raise PayloadTooLargeError(biggest, self.max_message_bytes)

    async def get_batch(self, max_items: int, wait_s: float = 0.0, owner: str | None = None,
                        min_priority: int | None = None, sizes: dict[Any, int] | None = None,
                        hints: bool = False, ignore: list[int] | None = None) -> bytes | list[int] | None:
        """Lease up to ``max_items`` messages (of priority ``>= min_priority`` if given); wait
        up to ``wait_s`` for one to be ready. ``sizes`` (typed pools): the caller's batch size
        per message type, used instead of ``max_items`` for a batch of that type. With
        ``hints``, a call that finds nothing here returns at once the indices of the peer
        queues that announced ready messages, as ``(index, announcement number)`` pairs (but
        the pairs in ``ignore``), if any: an idle consumer long-polls only its home queue and
        still hears where work is.

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
            if self._gossip is not None:
                self._count_peers()
            if hints and self._work_at:
                better = self._better_elsewhere(ignore, min_priority)
                if better:  # a peer has more urgent work than any here: go there first
                    return better
            lease = self._core.get_batch(max_items, now=now, owner=owner, min_priority=min_priority, sizes=sizes)
            if lease is not None:
                self._persist_lease(lease, now)
                self._reschedule()
                self._work_changed()
                return self._encode(lease)
            if hints:
                stale = set(map(tuple, ignore or ()))
                elsewhere = [(i, n) for i, (n, top) in sorted(self._work_at.items(), key=lambda w: -w[1][1])
                             if (i, n) not in stale and (min_priority is None or top >= min_priority)]
                if elsewhere:  # nothing here: say where there is work instead of waiting
                    return elsewhere
            remaining = deadline - now
            if remaining <= 0 or self._closed:
                return None
            assert self._ready_event is not None
            # A getter that takes anything counts; a reserved slot's (min_priority) does not:
            # it would leave ordinary work to wait here while other consumers idle.
            counted = min_priority is None
            self._getters += counted
            try:
                await asyncio.wait_for(self._ready_event.wait(), remaining)
            except asyncio.TimeoutError:
                return None
            finally:
                self._getters -= counted
                if counted and not self._getters:
                    self._work_changed()  # work nobody here now waits for is for the others

    def _better_elsewhere(self, ignore: list[Any] | None, min_priority: int | None = None) -> list[tuple[int, int]]:
        """Peers whose top ready priority is above this queue's (highest first): a consumer
        takes the most urgent work it can reach, not its home queue's first."""
        here = self._core.top_priority
        if here is None:
            return []
        stale = set(map(tuple, ignore or ()))
        floor = here if min_priority is None else max(here, min_priority - 1)
        better = [(top, i, n) for i, (n, top) in self._work_at.items() if top > floor and (i, n) not in stale]
        return [(i, n) for _, i, n in sorted(better, reverse=True)]

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
        for i, p in self._peers.items():  # a lost peer's work is not where a consumer can go
            if getattr(p, "_address", None) in addresses:
                self._work_at.pop(i, None)
        n = self._core.take_back(frozenset(addresses), error, now=now)
        if n and self._core.keyed_ready:
            self._notify_ready()  # a key freed by a dead-letter may let its next message go
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
        done, errors, fatal, results, consumer = decode_settle(blob)
        now = self._now()
        # Check, then store the results, then settle: if storage refuses the results, the
        # lease is still held and nothing is acked without its result.
        self._core.check_settlement(lease_id, done=done, errors=errors, fatal=fatal)
        if results is not None and done:
            ranges = _ran_ranges(lease, done)
            self._add_result(ResultRecord(self.index, ranges, sorted(errors), results, None, consumer))
        self._measure(lease, done, now)
        s = self._core.settle(lease_id, done=done, errors=errors, fatal=fatal, now=now)
        try:
            self._after_change(now)
        finally:  # it took effect even if storage failed: wake whoever it concerns
            self._announce(s)
            if s.n_released:
                self._work_changed()
        return s.n_acked, s.n_retried, s.n_dead, s.n_released

    def _announce(self, s: Settlement) -> None:
        """Wake the sweeper for retries, getters for released messages, outcome waiters."""
        if s.n_retried:
            self._reschedule()
        # Typed: a running slot was freed; keyed: a key may be free for its next message.
        if s.n_released or self._gossip is not None or self._core.keyed_ready:
            self._notify_ready()
        self._notify_outcomes()

    async def record_outcomes(self, ranges: list[tuple[int, int]], errors: dict[int, bytes], results: bytes,
                              consumer: int | None = None) -> None:
        """Store the outcomes of early-acked messages (already settled; failures are final)."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        self._add_result(ResultRecord(self.index, ranges, sorted(errors), results, errors, consumer))
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
        if self._handed_off:
            self._check_serving()
        return {d: self._funcs[d] for d in digests if d in self._funcs}

    async def fetch_results(self, cursor: int) -> tuple[int, bytes]:
        """Records from ``cursor`` on, and the next cursor; drops the records before ``cursor``.

        The records are a pickled list of :class:`~daskqueue.serialize.ResultRecord`; its
        ``final_errors`` are failures of early-acked messages (late-acked failures are retried
        and reach ``fetch_dead`` instead).
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        if self._handed_off:  # its results went to the successor, under the same numbers
            self._check_serving()
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
        if wait_s > 0 and cursor >= end and dead_cursor >= self._core.dead_appended:
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
        dead = self._core.dead_since(cursor)
        return self._core.dead_appended, [(d.seq, d.attempts, d.error, d.chunk.meta) for d in dead]

    async def dead_letters(self, limit: int | None = None, seqs: list[int] | None = None) -> list[tuple[Any, ...]]:
        """The dead letters (the first ``limit``, or those with these ``seqs``), oldest first:
        ``(seq, attempts, error, wall time, kind, function digest, type, key, priority,
        payload bytes or None)`` each, and the pickled functions they name."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._check_serving()
        wanted = None if seqs is None else set(seqs)
        dead = [d for d in self._core.dead if wanted is None or d.seq in wanted]
        if limit is not None:
            dead = dead[:limit]
        offset = time.time() - self._now()
        out = []
        for d in dead:
            meta, payload = d.chunk.meta, d.chunk.payload
            data = None
            if payload is not None:
                data = bytes(payload.data[payload.offsets[d.index] : payload.offsets[d.index + 1]])
            out.append((d.seq, d.attempts, d.error, d.at + offset,
                        getattr(meta, "kind", None), getattr(meta, "digest", None), d.chunk.type, d.chunk.key,
                        d.chunk.priority, data))
        return out

    async def replay_dead(self, seqs: list[int] | None = None) -> list[tuple[int, int, int, int]]:
        """Put dead letters (all, or those with these ``seqs``) back as new ready messages,
        attempts reset; then forget them as dead letters. Returns ``(old seq, 1, this queue,
        new seq)`` per message: the client reports their outcomes under their old ids. A dead
        letter whose payload was not kept (stores older than this format) stays dead."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        wanted = None if seqs is None else set(seqs)
        dead = [d for d in self._core.dead if (wanted is None or d.seq in wanted) and d.chunk.payload is not None
                and d.chunk.meta is not None]
        if not dead:
            return []
        groups = [_moved_group(Span(d.chunk, d.index, d.index + 1), 0.0) for d in dead]
        funcs = {g.digest: self._funcs[g.digest] for g in groups if g.digest is not None and g.digest in self._funcs}
        ranges = await self.put_batch(encode_put(groups, funcs), os.urandom(TOKEN_SIZE))
        if self._paused is not None:
            await self._unpaused()
        self._core.take_dead({d.seq for d in dead})
        self._after_change(self._now())
        logger.info("queue %d: %d dead letters replayed", self.index, len(dead))
        return [(d.seq, 1, self.index, first) for d, (first, _) in zip(dead, ranges)]

    async def purge(self, dead: bool = True, ready: bool = False, seqs: list[int] | None = None) -> tuple[int, int]:
        """Drop the dead letters (``dead``: all, or those with these ``seqs``) and the waiting
        messages (``ready``: ready and delayed ones; leased ones finish). Returns ``(dead
        letters, waiting messages)`` dropped."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        n_dead = len(self._core.take_dead(None if seqs is None else set(seqs))) if dead else 0
        n_ready = self._core.purge_waiting() if ready else 0
        self._after_change(self._now())
        if n_ready:
            self._work_changed()
        if n_dead or n_ready:
            logger.warning("queue %d: purged %d dead letters and %d waiting messages", self.index, n_dead, n_ready)
        return n_dead, n_ready

    async def stats(self) -> QueueStats:
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        if self._handed_off:
            self._check_serving()
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
            total_moved=s.total_moved,
        )

    async def close(self) -> None:
        """Refuse further calls, wake every waiter, stop the sweeper, wait for paused work to
        finish, then close storage. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in (self._gossip, self._announcer, self._fence_checker):
            if task is not None:
                task.cancel()
                await asyncio.wait({task})
        self._gossip = self._announcer = self._fence_checker = None
        if self._sweeper is not None:
            assert self._timer_changed is not None
            self._timer_changed.set()
            self._notify_ready()
            self._notify_outcomes()
            await self._sweeper  # it finishes a compaction it runs before it returns
            self._sweeper = None
        await self._unpaused()  # a compaction run by compact() still owns the storage
        self._close_storage()
        if self._reported_work and not self._handed_off:  # its backlog is no one's to run now
            self._report_load(closing=True)


def _ranges_of(stored: tuple[int, int], groups: list[Any]) -> list[tuple[int, int]]:
    """The answer to a retried put: its groups' ranges from the first put's first seq (the
    messages of one put have consecutive seqs)."""
    first, count = stored
    if sum(g.count for g in groups) != count:
        raise ValueError(f"a put token was reused for another put ({count} messages before)")
    ranges = []
    for g in groups:
        ranges.append((first, g.count))
        first += g.count
    return ranges


def _here() -> str:
    """The address of the worker this runs on ("" off a worker)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return ""


def _segment(span: Span) -> Segment:
    """The delivery segment of a leased span: its offsets and its slice of the payloads."""
    payload, meta = span.chunk.payload, span.chunk.meta
    offs = payload.offsets[span.start : span.stop + 1]
    return Segment(
        span.first_seq, span.count, span.attempts, meta.kind, meta.digest, meta.type,
        span.chunk.priority, meta.key, offs.tobytes(), payload.data[offs[0] : offs[-1]],
        getattr(meta, "time_limit_s", 0.0),
    )


def detach_payload(chunk: Chunk, i: int) -> ChunkPayload:
    """The payload of message ``i`` of ``chunk`` alone (what its dead letter keeps, so that
    one dead message does not keep its whole put batch in memory)."""
    p = chunk.payload
    a, b = p.offsets[i], p.offsets[i + 1]
    return ChunkPayload(array("I", [0, b - a]), bytes(p.data[a:b]))


def _moved_group(span: Span, delay_s: float) -> Group:
    """A put group of ``span``'s messages for another queue, due in ``delay_s``."""
    payload, meta = span.chunk.payload, span.chunk.meta
    offs = payload.offsets[span.start : span.stop + 1]
    base = offs[0]
    offsets = array("I", [o - base for o in offs])
    return Group(meta.kind, meta.digest, meta.type, span.chunk.priority, meta.key, delay_s, span.count,
                 offsets.tobytes(), bytes(payload.data[base : offs[-1]]), 0.0, getattr(meta, "time_limit_s", 0.0))


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
