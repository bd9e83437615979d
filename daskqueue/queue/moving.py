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
import pickle
from typing import TYPE_CHECKING, Any, Union

from daskqueue import defaults
from daskqueue.errors import QueueClosedError, QueueHandedOffError
from daskqueue.queue.core import Chunk
from daskqueue.queue.payload import moved_group
from daskqueue.queue.producer_results import AdoptedRuns, moved_record, record_producer, span_producers
from daskqueue.queue.ring import HashRing
from daskqueue.segment.format import TOKEN_SIZE
from daskqueue.serialize import PROTOCOL, encode_put

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore

__all__ = ["MovingMixin", "FENCE_CHECK_S"]

logger = logging.getLogger("daskqueue")

#: How often a queue with fenced keys asks the queues they moved from whether those still
#: hold a message of theirs.
FENCE_CHECK_S = 0.1

Moved = tuple[int, int, int, int]  # (old first seq, count, new queue, new first seq)
#: Per moved group: None (the owner's messages), or ``(producer, given queue, given first seq)``.
Origin = Union[tuple[int, int, int], None]


class MovingMixin:
    """Remote methods ``move_out``, ``adopt``, ``fence_keys``, ``holds_keys``; the fence checker task."""

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
        # The ids attached producers' messages moved here were given (see AdoptedRuns).
        self._adopted = AdoptedRuns()
        # Records numbered below this were found all the owner's (see _unforwarded).
        self._owners_upto = 0

    async def move_out(self, nodes: list[int], typed: bool = False,
                       everything: bool = False) -> tuple[list[Moved], list[str]]:
        """Hand the waiting messages that the pool's new ring of queues ``nodes`` routes
        elsewhere to those queues (peers of this one), each in put order: keyed messages by
        their key, every message by its type in a typed pool, and with ``everything`` (this
        queue is being removed) the unkeyed ones too, spread over the others in turn. A key
        whose message runs here (or waits for its retry) keeps that message here, and its new
        queue fences the key until this queue holds none of its messages: also when none of
        the key's messages moves (``fence_keys``), as its next put goes there.

        Each destination stores the messages before they leave here (a mover lease holds them
        meanwhile): a failure or a crash may deliver a message twice, never lose it. Once a
        destination took its messages, the caller gets their new ids even if recording the
        move here fails (a full disk: the record waits for the next write). Returns
        ``(old first seq, count, new queue, new first seq)`` per moved run (the client reports
        their outcomes under their old ids) and the errors of the destinations that did not
        take theirs (those messages stay here, in their places) or did not fence their keys
        (the caller asks again).

        Messages of an attached producer (tag not 0) travel with their origin (the id they
        were given): the destination files a moved record for that producer (see ``adopt``),
        who is not the caller.
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        now = self._now()
        dest, key_dest = self._destinations(nodes, typed, everything)
        leases, delays, fences = self._core.take_moving(dest, now=now, key_dest=key_dest)
        fences = {d: keys for d, keys in fences.items() if keys}
        if not leases:
            return [], await self._fence_at(fences)
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
            origins = self._origins(lease.spans)
            args: tuple[Any, ...] = (encode_put(groups, funcs), os.urandom(TOKEN_SIZE), sorted(fences.get(d, ())),
                                     self.index)
            calls[d] = asyncio.ensure_future(self._peers[d].adopt(*args, *([origins] if origins else [])))
        fenced = asyncio.ensure_future(self._fence_at({d: keys for d, keys in fences.items() if d not in leases}))
        await asyncio.wait(calls.values(), timeout=defaults.CONTROL_CALL_TIMEOUT_S)
        failed: list[str] = await fenced  # within its own timeout
        if self._paused is not None:  # a compaction may have begun meanwhile
            await self._unpaused()
        moved: list[Moved] = []
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

    async def _fence_at(self, fences: dict[int, set[str]]) -> list[str]:
        """Have each queue ``d`` of ``fences`` fence its keys (they go there, none of their
        messages moves there now, and one still runs here); the errors of those that did not."""
        calls = {d: asyncio.ensure_future(self._peers[d].fence_keys(sorted(keys), self.index))
                 for d, keys in fences.items()}
        if not calls:
            return []
        await asyncio.wait(calls.values(), timeout=defaults.CONTROL_CALL_TIMEOUT_S)
        failed = []
        for d, call in calls.items():
            if not call.done() or call.cancelled() or call.exception() is not None:
                call.cancel()
                error = "no answer in time" if not call.done() or call.cancelled() else repr(call.exception())
                failed.append(f"queue {d}: fencing keys: {error}")
        return failed

    def _destinations(self, nodes: list[int], typed: bool, everything: bool) -> tuple[Any, Any]:
        """``dest(chunk)``: the peer a chunk moves to under the ring of ``nodes``, or None;
        and ``key_dest(key)``, where a key goes (None in a typed pool: types move, not keys)."""
        ring = HashRing(nodes)
        others = [n for n in nodes if n != self.index and n in self._peers]
        turn = itertools.count()

        def key_dest(key: str) -> int | None:
            d = ring.node(key)
            return d if d != self.index and d in self._peers else None

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

        return dest, None if typed else key_dest

    async def fence_keys(self, fenced: list[str], source: int) -> None:
        """Keys ``fenced`` now come here while queue ``source`` still holds a message of
        each (it runs there, or waits for its retry; none of theirs moved): they run here
        only once ``source`` holds none of their messages. Called before any put of theirs
        comes here (``move_out`` answers after this)."""
        self._check_serving()
        self._core.fence_from(source, fenced)
        self._check_fences_soon()

    async def adopt(self, blob: bytes, token: bytes, fenced: list[str], source: int,
                    origins: list[Origin] | None = None) -> list[tuple[int, int]]:
        """``put_batch`` of messages that queue ``source`` moves here; the ``fenced`` keys
        run here only once ``source`` holds none of their messages (one of theirs still runs
        there).

        ``origins[i]`` (None for the owner's messages) is ``(producer, given queue, given
        first seq)`` of group ``i``: this queue files a moved record for that producer (see
        :func:`~daskqueue.queue.producer_results.moved_record`) before any of the messages
        can be delivered, so it reads the record before their outcomes. A retried adopt
        (a ``token`` stored already) files nothing again.
        """
        if fenced:
            self._check_serving()
            self._core.fence_from(source, fenced)
            self._check_fences_soon()
        again = token in self._tokens  # type: ignore[attr-defined]
        ranges = await self._put_now(blob, token)  # type: ignore[attr-defined]  # (queue/base.py)
        # No await between the put and here (``_put_now`` is never wrapped by a durable
        # queue's sync wait): no consumer can have leased these messages yet.
        if origins and not again:
            self._note_moved(ranges, origins)
        return ranges

    def _origins(self, spans: list[Any]) -> list[Origin]:
        """The origin of each span that moves (see ``adopt``); empty if all are the owner's."""
        producers = span_producers(spans, len(spans))
        if not any(producers):
            return []
        out: list[Origin] = []
        for span, producer in zip(spans, producers):
            out.append((producer, *self._adopted.given(self.index, span.first_seq)) if producer else None)
        return out

    def _note_replayed(self, dead: list[Any], ranges: list[tuple[int, int]]) -> None:
        """Dead letters ``dead`` were put back here at ``ranges`` (``replay_dead``): file a
        moved record for those of attached producers, as ``adopt`` does (call it right after
        the put, with no await in between: before any of them can be delivered)."""
        origins: list[Origin] = []
        for d in dead:
            producer = getattr(d.chunk.meta, "producer", 0) or 0
            origins.append((producer, *self._adopted.given(self.index, d.seq)) if producer else None)
        if any(origins):
            self._note_moved(ranges, origins)

    def _note_moved(self, ranges: list[tuple[int, int]], origins: list[Origin]) -> None:
        """File one moved record per attached producer for the groups of ``origins`` that
        now have ``ranges`` here, and remember their given ids (they may move on)."""
        by: dict[int, list[tuple[int, int, int, int]]] = {}
        for (first, count), origin in zip(ranges, origins):
            if origin is None:
                continue
            producer, given_queue, given_first = origin
            by.setdefault(producer, []).append((given_first, count, given_queue, first))
            self._adopted.add(first, count, given_queue, given_first)
        if not by:
            return
        for producer, runs in by.items():
            self._add_result(moved_record(self.index, producer, runs))  # type: ignore[attr-defined]
        try:
            self._after_change(self._now())  # type: ignore[attr-defined]
        except Exception as e:  # the records stay pending for the next write, as move_out's
            logger.warning("queue %d: recording moved records failed (pending for the next write): %s",
                           self.index, e)
        finally:
            self._notify_outcomes()  # type: ignore[attr-defined]

    # -- a removed queue's records of attached producers -----------------------------------------

    async def forward_records(self, dest: int) -> int:
        """This queue is being removed (drained, the owner's outcomes fetched): give the
        records its attached producers have not fetched yet (outcomes and moved records) to
        queue ``dest``, in order, where those producers read them (a record names its queue,
        so the ids stay). A producer that fetched some of them meanwhile reads them twice
        (at-least-once; its collector files an outcome once). Returns how many moved;
        raises the destination's error (the caller tries another)."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._check_serving()
        numbered = self._unforwarded()
        if not numbered:
            return 0
        records = [r for _, r in numbered]
        peer = self._peers[dest]
        await asyncio.wait_for(peer.take_records(pickle.dumps(records, PROTOCOL)), defaults.CONTROL_CALL_TIMEOUT_S)
        # Handed on: not again (a put that came meanwhile makes the owner drain and forward again).
        for number, record in numbered:
            k = number - self._results_base  # type: ignore[attr-defined]
            if 0 <= k < len(self._results) and self._results[k] is record:  # type: ignore[attr-defined]
                self._blank_result(k)  # type: ignore[attr-defined]
        logger.info("queue %d: %d records of attached producers handed to queue %d", self.index, len(records), dest)
        return len(records)

    def _unforwarded(self) -> list[tuple[int, Any]]:
        """``(number, record)`` of each record here that an attached producer has not fetched.

        No attached producer known (none heard of), it looks only at the records stored
        since the last call that found every record the owner's: ``remove_queue`` asks
        every pass, on this queue's event loop, and a queue may hold a million records of
        the owner, scanned each time before. (A record never turns from the owner's to an
        attached producer's: blanking makes it nobody's.)"""
        book, base, results = self._producers, self._results_base, self._results  # type: ignore[attr-defined]
        if not book.heard:
            start = max(0, self._owners_upto - base)
            if not any(record_producer(results[k]) for k in range(start, len(results))):
                self._owners_upto = base + len(results)
                return []
        return [(base + k, r) for k, r in enumerate(results) if record_producer(r) and book.wanted(r, base + k)]

    async def attached_producers(self) -> int:
        """How many attached producers (tags not 0) this queue heard of within their
        liveness window: ``remove_queue`` gives handles time to see it only if some exist."""
        book, now = self._producers, self._now()  # type: ignore[attr-defined]
        return sum(1 for heard in book.heard.values() if now - heard <= book.liveness_s)

    async def close_if_drained(self) -> bool:
        """Close this queue (as ``close``) if it holds no message and no record an attached
        producer has not fetched; False, still open, if it holds some (an attached producer's
        put that came after it was drained; the outcome of one that ran since the records were
        handed on, ``forward_records``: a closed queue's records are read by no producer but
        the owner). The checks and the close have no await between them: a put is either held
        here (and moved by the caller's next pass) or refused as closed, never lost, and so
        is a settle's record."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        if self._closed:
            return True
        if self._core.pending or self._unforwarded():
            return False
        await self.close()  # type: ignore[attr-defined]  # refuses calls before its first await
        return True

    async def take_records(self, blob: bytes) -> int:
        """Keep the records a removed queue forwards (``forward_records``) for their producers."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()  # type: ignore[attr-defined]
        records = pickle.loads(blob)
        for record in records:
            self._add_result(record)  # type: ignore[attr-defined]
        try:
            self._after_change(self._now())  # type: ignore[attr-defined]
        finally:  # the records are kept even if storage failed (see record_outcomes)
            self._notify_outcomes()  # type: ignore[attr-defined]
        return len(records)

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
