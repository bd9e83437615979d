"""Leasing messages to consumers: the long poll, and taking leases back (extension, lost
workers).

A mixin of :class:`~daskqueue.queue.base.QueueActorBase` (see there why mixins). Which
messages a call leases is the pure core's (``QueueCore.get_batch``); where else work waits,
the peers' (:class:`~daskqueue.queue.peer_state.PeerBoard`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from daskqueue.errors import QueueEmpty
from daskqueue.messages import killed_error
from daskqueue.queue.core import Lease
from daskqueue.queue.payload import delivery_segment
from daskqueue.queue.waiting import wait_event
from daskqueue.serialize import encode_delivery

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore
    from daskqueue.queue.peer_state import PeerBoard

__all__ = ["LeasingMixin"]

logger = logging.getLogger("daskqueue")


class LeasingMixin:
    """Remote methods ``get_batch``, ``get_batch_nowait``, ``end_polls``, ``extend``, ``workers_lost``."""

    # Owned by QueueActorBase and PeersMixin.
    index: int
    _core: QueueCore
    _board: PeerBoard
    _closed: bool
    _get_calls: int
    _getters: int
    _poll_ends: dict[str, int]
    _ready_event: asyncio.Event | None
    _gossip: asyncio.Task[None] | None

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
        closed, or :meth:`end_polls` or :meth:`workers_lost` ended the owner's polls, while
        waiting). Waiting awaits an event set by puts and redeliveries: an idle caller costs
        one call per ``wait_s``. ``owner`` (the caller's worker address) lets
        :meth:`workers_lost` take the lease back if that worker dies.
        """
        self._start()
        self._get_calls += 1
        deadline = self._now() + wait_s
        ended = self._poll_ends.get(owner, 0) if owner is not None else 0
        woken = False
        try:
            while True:
                if self._paused is not None:  # the gate, at the start and after every wait
                    await self._unpaused()
                if self._closed:
                    return None
                if owner is not None and self._poll_ends.get(owner, 0) != ended:
                    return None  # its consumer stops (end_polls), or its worker died (workers_lost)
                now = self._now()
                if self._gossip is not None:
                    self._count_peers()
                if hints and self._board.work_at:
                    better = self._board.better_than(self._core.top_priority, ignore, min_priority)
                    if better:  # a peer has more urgent work than any here: go there first
                        return better
                lease = self._core.get_batch(max_items, now=now, owner=owner, min_priority=min_priority, sizes=sizes)
                if lease is not None:
                    self._persist_lease(lease, now)
                    self._reschedule()
                    self._work_changed()
                    return encode_delivery(lease.lease_id, self.index, [delivery_segment(s) for s in lease.spans])
                if hints:
                    elsewhere = self._board.elsewhere(ignore, min_priority)
                    if elsewhere:  # nothing here: say where there is work instead of waiting
                        return elsewhere
                remaining = deadline - now
                if remaining <= 0 or self._closed:
                    return None
                if not await self._wait_ready(remaining, counted=min_priority is None):
                    return None
                woken = True
        finally:
            if woken:
                # Told to the peers here, once the work that woke this call is leased (or
                # not), not as its wait ended: no announcement of work about to be taken
                # here (a task and a round of the loop on the path of every task).
                self._work_changed()

    async def _wait_ready(self, timeout_s: float, *, counted: bool) -> bool:
        """Wait up to ``timeout_s`` for the ready event; returns whether it came. A getter
        that takes anything is ``counted`` (a reserved slot's, with a ``min_priority``, is
        not: it would leave ordinary work to wait here while other consumers idle). Woken,
        its caller tells the peers of the change once it has leased (``get_batch``)."""
        assert self._ready_event is not None
        self._getters += counted
        woke = False
        try:
            woke = await wait_event(self._ready_event, timeout_s)
            return woke
        finally:
            self._getters -= counted
            if counted and not self._getters and not woke:
                self._work_changed()  # work nobody here now waits for is for the others

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

    async def end_polls(self, owner: str) -> None:
        """The consumers on worker ``owner`` stop: their ``get_batch`` calls waiting here
        answer ``None`` now instead of at the end of their ``wait_s`` (a consumer there that
        still runs just polls again). Leases nothing and changes no message."""
        self._end_polls([owner])

    def _end_polls(self, owners: list[str]) -> None:
        for owner in owners:
            self._poll_ends[owner] = self._poll_ends.get(owner, 0) + 1
        if self._ready_event is not None:
            self._notify_ready()

    async def get_batch_nowait(self, max_items: int) -> bytes:
        """Like ``get_batch`` without waiting; raises :class:`QueueEmpty` if nothing is ready."""
        blob = await self.get_batch(max_items, 0.0)
        if blob is None:
            raise QueueEmpty(f"queue {self.index} has no ready message")
        return blob

    async def workers_lost(self, addresses: list[str]) -> int:
        """These workers died: end their consumers' polls waiting here, take back at once
        every lease they held (an attempt each, see ``QueueCore.take_back``); return how
        many messages."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        now = self._now()
        error = killed_error(f"the worker running this message died ({', '.join(sorted(addresses))})")
        self._peers_lost(addresses)
        # Their consumers' polls may still wait here (Dask does not end a call whose caller
        # died): they end now, else the first would lease what is taken back below to the
        # dead worker, and no one would take it back before the lease expired.
        self._end_polls(addresses)
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

    async def extend(self, lease_ids: list[int]) -> list[int]:
        """Extend live leases by ``lease_timeout_s`` from now; return the ids no longer held."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        return self._core.extend(lease_ids, now=self._now())
