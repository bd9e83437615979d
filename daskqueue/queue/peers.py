"""The queue actor's talk with the other queues of its pool: work announcements and, in typed
pools, gossip of counts per type and the consumer pools' slots.

A mixin of :class:`~daskqueue.queue.base.QueueActorBase` (see there why mixins); the state
and every decision live in the pure :class:`~daskqueue.queue.peer_state.PeerBoard`
(``self._board``), this module does the calls and reads the clock.

Threading: every method runs on the worker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from daskqueue import defaults
from daskqueue.queue.handles import bind_local, worker_handle
from daskqueue.queue.peer_state import PeerBoard

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore

__all__ = ["PeersMixin"]

logger = logging.getLogger("daskqueue")


class PeersMixin:
    """Remote methods ``set_slots``, ``set_peers``, ``work_at``, ``peer_counts``."""

    # Owned by QueueActorBase.
    index: int
    _core: QueueCore
    _closed: bool
    _getters: int  # calls waiting in get_batch: this queue's own idle consumers
    _ready_event: asyncio.Event | None

    def _init_peers(self) -> None:
        # The epoch: this incarnation's announcements number above its predecessors' (see
        # daskqueue.queue.peer_state), the one clock read the board's numbering takes.
        self._board = PeerBoard(self.index, epoch=time.time_ns() // 1000, stale_after_s=defaults.TYPE_GOSSIP_STALE_S)
        self._slots: dict[str, int] = {}  # consumer pool -> batches it runs at once
        self._peers: dict[int, Any] = {}  # queue index -> handle, every other queue of the pool
        self._announcer: asyncio.Task[None] | None = None
        self._gossip: asyncio.Task[None] | None = None

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
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        # Starts the sweeper too: it closes this actor if its pool's client dies before any
        # other call came (a durable queue would keep its directory locked otherwise).
        self._start()
        self._peers = {i: bind_local(worker_handle(r)) for i, r in enumerate(refs)
                       if i != self.index and r is not None}
        self._board.keep_only(self._peers)
        self._work_changed()

    async def work_at(self, index: int, top_priority: int | None, number: int = 0, seen: int = 0) -> None:
        """Queue ``index`` of the pool has ready messages now, the highest of priority
        ``top_priority`` (None: it has none left), said in its announcement ``number`` (a
        consumer that found the queue empty after all ignores that announcement, not the
        next one). ``seen``: the latest announcement number that queue heard from this
        one's index (an earlier incarnation's may be above this one's own: then this one
        numbers on above it and announces afresh, or that queue would ignore it)."""
        if self._board.heard(index, top_priority, number) and self._ready_event is not None:
            self._notify_ready()  # a consumer idle on this queue may go there
        if seen and self._board.heard_of_me(seen):
            logger.info("queue %d: queue %d heard announcement %d of an earlier incarnation of this "
                        "queue; numbering on above it", self.index, index, seen)
            self._work_changed()

    async def peer_counts(self, index: int, counts: dict[Any, tuple[int, int]]) -> None:
        """Queue ``index`` of the pool has these ready messages and running batches per type."""
        self._board.report(index, counts, time.monotonic())
        if self._ready_event is not None:
            self._notify_ready()  # a peer's slot may have freed: waiting getters look again

    def _peers_lost(self, addresses: list[str]) -> None:
        """A lost peer's work is not where a consumer can go."""
        self._board.forget_work(i for i, p in self._peers.items() if getattr(p, "_address", None) in addresses)

    def _count_peers(self) -> None:
        """Sum the fresh peer reports into the core's view of the rest of the pool."""
        self._core.peer_ready, self._core.peer_running = self._board.totals(time.monotonic())

    # -- announcing this queue's work ------------------------------------------------------------

    def _work_changed(self) -> None:
        """After anything that may change whether this queue has ready messages: tell the
        peers when it did, at most every ``WORK_ANNOUNCE_S`` (the latest state goes out)."""
        if not self._peers or self._closed:
            return
        if self._board.changed(self._work_for_others()) and self._announcer is None:
            self._announcer = asyncio.get_running_loop().create_task(self._announce_work())

    async def _announce_work(self) -> None:
        try:
            wait = self._board.wait_before_announcing(time.monotonic())
            if wait > 0:
                await asyncio.sleep(wait)
            top = self._work_for_others()
            if not self._board.news(top):
                return
            number = self._board.announce(top, time.monotonic())
            await self._call_peers({i: p.work_at(self.index, top, number, self._board.last_heard(i))
                                    for i, p in self._peers.items()}, "work_at")
        finally:
            self._announcer = None
        if self._board.news(self._work_for_others()) and not self._closed:
            self._work_changed()  # it changed again meanwhile

    def _work_for_others(self) -> int | None:
        """The top priority of ready messages that no call waiting here will take (None if
        none): while this queue's own consumers wait on it, a put is theirs, and waking every
        idle consumer of the pool for it would only make them race for one message."""
        return None if self._getters else self._core.top_priority

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
        """Call ``method(*args)`` on every peer at once (see :meth:`_call_peers`)."""
        await self._call_peers({i: getattr(p, method)(*args) for i, p in self._peers.items()}, method)

    async def _call_peers(self, calls_by_peer: dict[int, Any], method: str) -> None:
        """Await the peers' calls (peer index -> awaitable) at once, waiting at most a second:
        a peer that does not answer is skipped (what it misses goes stale, see its readers)."""
        calls = [asyncio.ensure_future(c) for c in calls_by_peer.values()]
        if not calls:
            return
        done, pending = await asyncio.wait(calls, timeout=defaults.TYPE_GOSSIP_STALE_S / 3)
        for call in pending:
            call.cancel()
        for call in done:
            if not call.cancelled() and call.exception() is not None:
                logger.debug("queue %d: a peer did not take %s: %s", self.index, method, call.exception())

    async def _stop_peer_tasks(self) -> None:
        """Cancel the gossip and an announcement on its way, and wait for both to end."""
        for task in (self._gossip, self._announcer):
            if task is not None:
                task.cancel()
                await asyncio.wait({task})
        self._gossip = self._announcer = None
