"""Moving messages between the queues of a pool (``add_queues`` / ``remove_queue``), and the
fences that keep a moved key's messages one at a time and in put order across two queues.

A mixin of :class:`~daskqueue.queue.base.QueueActorBase` (see there why mixins). Which
messages move and where is the pure core's (``QueueCore.take_moving``) and the ring's
(:class:`~daskqueue.queue.ring.HashRing`); this module makes the calls and keeps, per source
queue, the keys fenced here until that source holds none of their messages.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from typing import TYPE_CHECKING, Any

from daskqueue import defaults
from daskqueue.errors import QueueClosedError, QueueHandedOffError
from daskqueue.queue.core import Chunk
from daskqueue.queue.payload import moved_group
from daskqueue.queue.ring import HashRing
from daskqueue.segment.format import TOKEN_SIZE
from daskqueue.serialize import encode_put

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore

__all__ = ["MovingMixin", "FENCE_CHECK_S"]

logger = logging.getLogger("daskqueue")

#: How often a queue with fenced keys asks the queues they moved from whether those still
#: hold a message of theirs.
FENCE_CHECK_S = 0.1

Moved = tuple[int, int, int, int]  # (old first seq, count, new queue, new first seq)


class MovingMixin:
    """Remote methods ``move_out``, ``adopt``, ``holds_keys``; the fence checker task."""

    # Owned by QueueActorBase and PeersMixin.
    index: int
    kind: str
    _core: QueueCore
    _closed: bool
    _funcs: dict[bytes, bytes]
    _peers: dict[int, Any]

    def _init_moving(self) -> None:
        # Keys moved here while one of their messages ran in the queue they came from are
        # fenced in the core (``core.fences``, by source) until the source has none left;
        # this task asks the sources.
        self._fence_checker: asyncio.Task[None] | None = None

    async def move_out(self, nodes: list[int], typed: bool = False,
                       everything: bool = False) -> tuple[list[Moved], list[str]]:
        """Hand the waiting messages that the pool's new ring of queues ``nodes`` routes
        elsewhere to those queues (peers of this one), each in put order: keyed messages by
        their key, every message by its type in a typed pool, and with ``everything`` (this
        queue is being removed) the unkeyed ones too, spread over the others in turn. A key
        whose message runs here (or waits for its retry) keeps that message here, and its new
        queue fences the key until this queue holds none of its messages.

        Each destination stores the messages before they leave here (a mover lease holds them
        meanwhile): a failure or a crash may deliver a message twice, never lose it. Once a
        destination took its messages, the caller gets their new ids even if recording the
        move here fails (a full disk: the record waits for the next write). Returns
        ``(old first seq, count, new queue, new first seq)`` per moved run (the client reports
        their outcomes under their old ids) and the errors of the destinations that did not
        take theirs (those messages stay here, in their places).
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        now = self._now()
        leases, delays, fences = self._core.take_moving(self._destinations(nodes, typed, everything), now=now)
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
            groups = [moved_group(span, delay) for span, delay in zip(lease.spans, delays[d])]
            funcs = {g.digest: self._funcs[g.digest] for g in groups if g.digest is not None}
            calls[d] = asyncio.ensure_future(
                self._peers[d].adopt(encode_put(groups, funcs), os.urandom(TOKEN_SIZE), sorted(fences[d]), self.index)
            )
        await asyncio.wait(calls.values(), timeout=defaults.CONTROL_CALL_TIMEOUT_S)
        if self._paused is not None:  # a compaction may have begun meanwhile
            await self._unpaused()
        moved: list[Moved] = []
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
        except Exception as e:
            # The moves took effect: the destinations hold the messages and this queue
            # dropped them. The caller must learn their new ids whatever storage says here;
            # the records stay pending for the next write that succeeds (a crash before it
            # delivers those messages twice, never loses them).
            logger.warning("queue %d: recording a move failed (pending for the next write): %s", self.index, e)
        finally:
            self._notify_ready()
            self._work_changed()
        if moved:
            logger.info("queue %d: %d messages moved to queues %s", self.index,
                        sum(m[1] for m in moved), sorted({m[2] for m in moved}))
        return moved, failed

    def _destinations(self, nodes: list[int], typed: bool, everything: bool) -> Any:
        """``dest(chunk)``: the peer a chunk moves to under the ring of ``nodes``, or None."""
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

        return dest

    async def adopt(self, blob: bytes, token: bytes, fenced: list[str], source: int) -> list[tuple[int, int]]:
        """``put_batch`` of messages that queue ``source`` moves here; the ``fenced`` keys
        run here only once ``source`` holds none of their messages (one of theirs still runs
        there)."""
        if fenced:
            self._check_serving()
            self._core.fence_from(source, fenced)
            self._check_fences_soon()
        return await self.put_batch(blob, token)

    async def holds_keys(self, keys: list[str]) -> list[str]:
        """Those of ``keys`` that a message in this queue still has (running, waiting)."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._check_serving()
        return sorted(self._core.keys_present(set(keys)))

    def _check_fences_soon(self) -> None:
        if self._fence_checker is None and self._core.fences and not self._closed:
            self._fence_checker = asyncio.get_running_loop().create_task(self._check_fences())

    async def _check_fences(self) -> None:
        """Every ``FENCE_CHECK_S`` while keys are fenced: ask their source queues which of
        them they still hold, and unfence the others. A source that was removed, or lost
        with its worker (a transient queue's messages went with it), holds none; a durable
        one that is being reopened elsewhere is asked again once the pool says where."""
        try:
            while self._core.fences and not self._closed:
                await asyncio.sleep(FENCE_CHECK_S)
                for source, keys in self._core.fences.by_source().items():
                    held = await self._held_at(source, keys)  # adopt may add keys meanwhile
                    if held is None:
                        continue
                    if self._paused is not None:
                        await self._unpaused()
                    self._unfence(source, held[0] - held[1])
        finally:
            self._fence_checker = None

    async def _held_at(self, source: int, asked: set[str]) -> tuple[set[str], set[str]] | None:
        """``(asked, held)``: which of the ``asked`` keys queue ``source`` still holds; None
        if that is not known now (ask again later)."""
        peer = self._peers.get(source)
        try:
            held = set() if peer is None else set(await asyncio.wait_for(
                peer.holds_keys(sorted(asked)), defaults.CONTROL_CALL_TIMEOUT_S))
        except (QueueHandedOffError, asyncio.TimeoutError):
            return None
        except Exception as e:
            if self.kind == "durable" and not isinstance(e, QueueClosedError):
                return None  # reopened elsewhere, with the key's message: ask there
            logger.info("queue %d: queue %d is gone (%s); unfencing its keys", self.index, source, e)
            held = set()
        return asked, held

    def _unfence(self, source: int, free: set[str]) -> None:
        """Keys ``free`` of those fenced for ``source`` may run here now."""
        if not free:
            return
        self._core.unfence_from(source, free)
        self._notify_ready()
        self._work_changed()

    async def _stop_fence_checker(self) -> None:
        task = self._fence_checker
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        self._fence_checker = None
