"""The actor shell around :class:`~daskqueue.queue.core.QueueCore`: the data plane and the
lifecycle.

Adds what the core leaves out: the clock, the events long-polling waiters wait on, settling
(``settle``), ``stats`` and ``close``, the state the jobs below share (the function table and
the put tokens among it), and storage hooks a durable subclass fills in. The rest of the
shell is one module per job, each a mixin of :class:`QueueActorBase`:

* :mod:`~daskqueue.queue.putting`: puts (``put_batch``), their checks and tokens;
* :mod:`~daskqueue.queue.leasing`: leasing to consumers (the long poll), extending and
  taking leases back;
* :mod:`~daskqueue.queue.sweeper`: the sweeper task (lease expiry, delayed messages,
  housekeeping, load reports, the orphan check);
* :mod:`~daskqueue.queue.peers`: announcements and gossip between the pool's queues, their
  state a pure :class:`~daskqueue.queue.peer_state.PeerBoard`;
* :mod:`~daskqueue.queue.moving`: moving messages to other queues and the fences that follow;
* :mod:`~daskqueue.queue.handoff`: handing the whole state to a successor, in two phases;
* :mod:`~daskqueue.queue.outbox`: results and dead letters for the client, dead-letter admin;
* :mod:`~daskqueue.queue.functions`: the function table (``get_functions``) and its sweep;
* :mod:`~daskqueue.queue.gate`: pausing the queue for work off the loop;
* :mod:`~daskqueue.queue.lane_server`: the lane, a synchronous client's puts and outcome
  polls, and other workers' fetches, settles and announcements, on a socket of their own
  (started on the first ask, stopped on close).

Why mixins, not owner objects: Dask calls an actor's methods by name on the actor's class, and
a durable queue overrides storage hooks (``_after_change``, ``_add_result``,
``_housekeeping``, ``_export_handoff``...) that every one of these jobs calls. As owner
objects, each would call back into the actor for those hooks and the clock, and the actor
would forward every remote method to them: forwarding both ways, no separation gained. So
each job is a mixin with its own state (made by its ``_init_*``), the attributes it uses of
the others declared at its top; state with decisions worth testing alone is a pure class
composed in (``PeerBoard``).

Threading: every public method is ``async def`` and runs on the worker's event loop; none
blocks. Work per call is bounded by the size of its blob. Work that grows with the whole
queue runs behind the gate (:mod:`~daskqueue.queue.gate`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from daskqueue import defaults, metrics
from daskqueue.errors import (
    LeaseExpiredError,
    QueueClosedError,
    QueueHandedOffError,
)
from daskqueue.queue.core import Chunk, QueueCore, Settlement
from daskqueue.queue.functions import FunctionsMixin, FunctionTable
from daskqueue.queue.gate import GateMixin
from daskqueue.queue.lane_server import LaneMixin
from daskqueue.queue.handoff import HandoffMixin
from daskqueue.queue.leasing import LeasingMixin
from daskqueue.queue.moving import FENCE_CHECK_S, MovingMixin
from daskqueue.queue.outbox import OutboxMixin
from daskqueue.queue.payload import ChunkPayload, detach_payload, ran_ranges
from daskqueue.queue.peer_state import WORK_ANNOUNCE_S
from daskqueue.queue.peers import PeersMixin
from daskqueue.queue.policy import FIFO, TypePolicy
from daskqueue.queue.putting import TOKENS_KEPT, PuttingMixin
from daskqueue.queue.sweeper import LOAD_REPORT_S, SweeperMixin
from daskqueue.queue.producer_results import span_producers
from daskqueue.serialize import ResultRecord, decode_settle

__all__ = ["QueueActorBase", "QueueStats", "ChunkPayload", "TOKENS_KEPT", "detach_payload",
           "LOAD_REPORT_S", "WORK_ANNOUNCE_S", "FENCE_CHECK_S"]

logger = logging.getLogger("daskqueue")

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
    total_moved: int = 0  # handed to another queue by add_queues / remove_queue
    functions: int = 0  # functions held: those its messages and dead letters use (and newer)
    idle_functions: int = 0  # functions no message uses, kept in case they are used again

    @property
    def pending(self) -> int:
        """Messages not yet settled (ready, delayed or leased)."""
        return self.ready + self.delayed + self.leased


class QueueActorBase(PuttingMixin, LeasingMixin, OutboxMixin, MovingMixin, HandoffMixin, PeersMixin, SweeperMixin,
                     FunctionsMixin, GateMixin, LaneMixin):
    """Shared shell of the queue actors; see :class:`TransientQueue` for the public contract."""

    kind = "base"
    #: Whether this queue takes packed put groups (see :mod:`daskqueue.serialize`). A
    #: durable queue does not: its CHUNK records hold one payload per message
    #: (``segment/FORMAT.md``), and it never unpickles a blob to cut it.
    stores_packed = True

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
        lane: bool = True,
    ) -> None:
        self.index = index
        self.pool = pool
        self._lane_ok = lane  # False: this actor serves no lane (its pool's client said so)
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
        self._funcs = FunctionTable()  # see daskqueue.queue.functions
        self._tokens: dict[bytes, tuple[int, int]] = {}  # put token -> (first seq, count)
        # record_outcomes tokens, apart: early-acked batches must not push put tokens out
        # (a put retried after a lost answer would then be stored twice). Handed off.
        self._outcome_tokens: dict[bytes, None] = {}
        self._closed = False
        self._handed_off = False  # its state went to a successor: it serves no more (see handoff)
        self._get_calls = 0
        self._getters = 0  # calls waiting in get_batch: this queue's own idle consumers
        self._poll_ends: dict[str, int] = {}  # owner -> how many times its polls were ended (end_polls, workers_lost)
        self._ready_event: asyncio.Event | None = None
        self._init_gate()
        self._init_sweeper()
        self._init_peers()
        self._init_moving()
        self._init_outbox()
        self._init_handoff()

    def __repr__(self) -> str:
        s = self._core.stats()
        return f"<{type(self).__name__} {self.index}: ready={s.ready} leased={s.leased} dead={s.dead}>"

    @staticmethod
    def _now() -> float:
        return time.monotonic()

    def _start(self) -> None:
        """Create the events and the background tasks on first use (``__init__`` runs off
        the loop)."""
        self._check_serving()
        if self._sweeper is None:
            self._ready_event = asyncio.Event()
            self._outcome_event = asyncio.Event()
            self._start_sweeper()
            if self._core.policy.typed:
                self._gossip = asyncio.get_running_loop().create_task(self._gossip_forever())
            self._check_fences_soon()  # fences handed over by a predecessor
            metrics.ensure_registered()  # this worker's /metrics shows its queues

    def _check_serving(self) -> None:
        if self._handed_off:
            raise QueueHandedOffError(self.index, _here())
        if self._closed:
            raise QueueClosedError(f"queue {self.index} is closed")

    def _notify_ready(self) -> None:
        # Waiters hold the old event; new waiters get a fresh one.
        assert self._ready_event is not None
        self._ready_event.set()
        self._ready_event = asyncio.Event()

    # -- storage hooks (no-ops in memory; see also OutboxMixin, SweeperMixin, HandoffMixin) ----

    def _fit_groups(self, groups: list[Any]) -> list[Any]:
        """Split put groups that storage cannot hold in one record (identity in memory)."""
        return groups

    def _on_put(self, chunks: list[tuple[Chunk, float]], funcs: dict[bytes, bytes], now: float,
                token: bytes | None, ranges: list[tuple[int, int]]) -> None:
        """Persist freshly put chunks (new functions, the put's token) before it is answered."""

    def _after_change(self, now: float) -> None:
        """Persist the core's journalled transitions before the call is answered."""

    def _housekeeping_due_in(self) -> float | None:
        """Seconds until ``_housekeeping`` should run (None: nothing scheduled)."""
        return None

    async def _housekeeping(self) -> None:
        """Periodic storage work (interval syncs, compaction), run by the sweeper; and the
        function sweep when due."""
        self._sweep_functions_if_due()

    def _close_storage(self) -> None:
        """Release storage on close."""

    # -- settling -------------------------------------------------------------------------------

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
            ranges = ran_ranges(lease, done)
            record = ResultRecord(self.index, ranges, sorted(errors), results, None, consumer)
            self._store_record(record, span_producers(lease.spans, len(ranges)))
        self._measure(lease, done, now)
        s = self._core.settle(lease_id, done=done, errors=errors, fatal=fatal, now=now)
        try:
            self._after_change(now)
        finally:  # it took effect even if storage failed: wake whoever it concerns
            self._announce(s)
            if s.n_released:
                self._work_changed()
            self._report_if_emptied()
        return s.n_acked, s.n_retried, s.n_dead, s.n_released

    def _announce(self, s: Settlement) -> None:
        """Wake the sweeper for retries, getters for released messages, outcome waiters."""
        if s.n_retried:
            self._reschedule()
        # Typed: a running slot was freed; keyed: a key may be free for its next message.
        if s.n_released or self._gossip is not None or self._core.keyed_ready:
            self._notify_ready()
        self._notify_outcomes()

    # -- inspection and lifecycle ------------------------------------------------------------

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
            functions=len(self._funcs.held),
            idle_functions=self._funcs.idle_count,
        )

    def metrics_sample(self) -> metrics.QueueSample:
        """What ``/metrics`` and the status page show of this queue (:mod:`daskqueue.metrics`).

        Plain, not ``async``: the metrics read it on the worker's event loop, between calls.
        Counting the bytes held is O(spans), about 10 ms per 100,000 runs of messages; while
        a compaction runs (its thread owns the state) they are left out."""
        s = self._core.stats()
        return metrics.QueueSample(
            index=self.index, pool=self.pool or "", kind=self.kind, serving=not (self._closed or self._handed_off),
            ready=s.ready, delayed=s.delayed, leased=s.leased, dead=s.dead,
            bytes=None if self._paused is not None else self._bytes_held(),
            puts=s.total_put, acks=s.total_acked, retries=s.total_retried, expired=s.total_expired,
            worker_lost=s.total_taken_back, moved=s.total_moved, dead_letters=self._core.dead_appended,
            purged=s.total_purged,
        )

    def _bytes_held(self) -> int:
        """Payload bytes of the messages (ready, delayed, leased) and the dead letters."""
        live = ((span.chunk.payload, span.start, span.stop) for span, _ in self._core.live_spans())
        dead = ((d.chunk.payload, d.index, d.index + 1) for d in self._core.dead)
        return metrics.payload_bytes(live) + metrics.payload_bytes(dead)

    async def close(self) -> None:
        """Refuse further calls, wake every waiter, stop the background tasks, wait for paused
        work to finish, then close storage. Idempotent."""
        if self._closed:
            if self._handed_off:
                await self._make_handoff_final()  # nobody wants it back
            return
        await self._stop_serving()
        self._close_storage()
        if self._reported_work and not self._handed_off:  # its backlog is no one's to run now
            self._report_load(closing=True)

    async def _stop_serving(self) -> None:
        """Refuse calls, wake the waiters, stop the background tasks and wait for paused work."""
        self._closed = True
        # The peers' tasks and the fence checker first: they call other queues and would
        # otherwise find this one half stopped; the sweeper last, it may be compacting.
        await self._stop_peer_tasks()
        await self._stop_fence_checker()
        if self._ready_event is not None:
            self._notify_ready()
            self._notify_outcomes()
        await self._stop_sweeper()
        await self._unpaused()  # a compaction run by compact() still owns the storage
        await self._stop_lane()  # last: calls it carried were answered or refused above


def _here() -> str:
    """The address of the worker this runs on ("" off a worker)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return ""
