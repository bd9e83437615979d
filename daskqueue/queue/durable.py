"""The durable queue actor: the queue shell over a segment store (``daskqueue/segment``).

Its jobs, one module each: writing each call's changes through (``durable_writing``),
recovery (``durable_recovery``), compaction (``durable_compaction``), the bodies of its own log
records (``durable_bodies``), syncs off the event loop (``syncing``). This module opens the
store, and closes, reopens, hands off and inspects it.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import time
from typing import Any

from daskqueue import defaults
from daskqueue.errors import QueueClosedError, StoreError
from daskqueue.queue.base import QueueActorBase
from daskqueue.queue.durable_bodies import (  # re-exported: other modules import them from here
    DEAD_BODY_MAGIC,
    MAX_ATTEMPTS_ON_DISK,
    decode_dead_body,
    encode_dead_body,
    split_result_record,
)
from daskqueue.queue.durable_compaction import CompactionMixin
from daskqueue.queue.durable_recovery import RecoveryMixin
from daskqueue.queue.durable_writing import WritingMixin
from daskqueue.queue.syncing import LoopSyncs, answers_when_durable
from daskqueue.segment.format import IndexRecord
from daskqueue.segment.recovery import replay
from daskqueue.segment.store import FsyncPolicy, SegmentStore

__all__ = ["DurableQueue", "split_result_record", "encode_dead_body", "decode_dead_body", "DEAD_BODY_MAGIC"]

logger = logging.getLogger("daskqueue")


# Under fsync="always" these answer only once their writes are synced (off the loop).
@answers_when_durable("put_batch", "adopt", "get_batch", "get_batch_nowait", "settle", "record_outcomes",
                      "fetch_results", "fetch_outcomes", "workers_lost", "replay_dead", "purge", "move_out")
class DurableQueue(RecoveryMixin, CompactionMixin, WritingMixin, QueueActorBase):
    """A queue actor whose messages survive the death of its process and cluster restarts.

    Every transition is written through the segment store in ``dirpath`` before the call that
    caused it is answered (one log append and one index append per call: group commit).
    Reopening the directory (a new actor, on any worker that sees it) recovers every message
    by the rules of ``daskqueue/segment/FORMAT.md``; ``recovery_report()`` says what recovery
    found. ``fsync`` is ``"always"``, ``"interval"`` (default, every ``fsync_interval_s``) or
    ``"never"``; a process crash loses nothing acknowledged under any of them.

    When storage fails (a :class:`StoreError`: a full disk, an I/O error), the call raises.
    A ``put_batch`` or ``get_batch`` that raised changed nothing (the lease it made is given
    back). A ``settle`` that raised either changed nothing (its results could not be stored:
    the lease is still held) or took effect in the queue but is not yet on disk: then the
    lease is gone (settling it again raises :class:`LeaseExpiredError`), its results wait
    for ``fetch_results`` and its messages are not delivered again. Its records stay pending
    and go out, before anything newer, with the next write that succeeds: once any later
    call has succeeded, it is as durable as that call. If the queue dies first (or its store
    refuses every write after an I/O error it cannot undo, see FORMAT.md), the reopened
    queue delivers those messages again, one attempt counted, and their results are gone:
    run twice, never lost. A lease expiry the sweeper cannot persist is logged and pending
    the same way.

    Same actor methods as :class:`TransientQueue`, plus ``recovery_report()``,
    ``disk_usage()`` and ``compact()``. Recovery runs in ``__init__``, on a worker thread, off
    the event loop. Compaction (automatic once the index passes ``compact_index_bytes``, or
    ``compact()``) runs on a thread of its own while the queue is paused: calls made meanwhile
    wait for it, and the event loop stays free for everything else on the worker.
    """

    kind = "durable"
    stores_packed = False  # its CHUNK records are per message (segment/FORMAT.md)
    #: The clock of what is persisted (not-before times, dead-letter times): the wall clock,
    #: which a reopen on another machine shares. The core runs on the monotonic ``_now``;
    #: times convert at this boundary (``_wall_offset``).
    _wall = staticmethod(time.time)

    def __init__(
        self,
        index: int,
        dirpath: str,
        *,
        fsync: FsyncPolicy = "interval",
        fsync_interval_s: float = defaults.FSYNC_INTERVAL_S,
        max_segment_bytes: int = defaults.MAX_SEGMENT_BYTES,
        compact_index_bytes: int = defaults.COMPACT_INDEX_BYTES,
        handoff: bytes | None = None,
        dir_mode: int = defaults.DIR_MODE,
        **kwargs: Any,
    ) -> None:
        """``handoff``: what ``hand_off()`` of this queue's previous actor returned (its
        worker is retiring). Recovery reads the directory as after a crash, but the leases
        that actor held stay leased, under their ids, instead of coming back (rule 6)."""
        super().__init__(index, **kwargs)
        if self._core.max_retries >= MAX_ATTEMPTS_ON_DISK:
            raise ValueError(f"max_retries must be < {MAX_ATTEMPTS_ON_DISK} for a durable queue")
        started = time.perf_counter()
        self.dirpath = dirpath
        self._store = SegmentStore(
            dirpath,
            max_segment_bytes=max_segment_bytes,
            fsync=fsync,
            fsync_interval_s=fsync_interval_s,
            compact_index_bytes=compact_index_bytes,
            lock_wait_s=defaults.LOCK_WAIT_S if _on_worker() else 0.0,
            dir_mode=dir_mode,
        )
        self._syncs = LoopSyncs(self._store)
        self._core.journal = []
        self._func_refs: dict[bytes, tuple[int, int]] = {}
        self._result_refs: list[int] = []  # segment of each record in self._results
        self._chunk_live: dict[int, list[int]] = {}  # base_seq -> [segment, unsettled count]
        self._dead_errors: dict[int, tuple[int, int]] = {}  # seq -> error record location
        self._pending: list[IndexRecord] = []  # index records to go out with the next append
        self._unpins: list[int] = []  # segments to unpin once self._pending is in the index
        self._compaction_due = False  # the sweeper compacts when it next wakes
        self._swept_func_bytes = 0  # FUNC bytes swept since the last compaction (_functions_swept)
        try:
            recovered = replay(self._store.take_records(), self._store.read_log, self._store.report)
            state = pickle.loads(handoff) if handoff is not None else {"leases": [], "fences": {}}
            self._restore(recovered, state["leases"])
            self._core.fences.load(state["fences"])
            if "producers" in state:  # their cursors and liveness (a reopen has none: see outbox)
                self._producers.load(state["producers"], self._now())
        except BaseException:
            self._store.close()
            raise
        self._recovery = {
            "messages": self._core.stats().pending,
            "dead_letters": len(self._core.dead),
            "results": len(self._results),
            "lost_messages": recovered.lost_messages,
            "corruptions": [str(e) for e in self._store.corruptions],
            "dropped": [dataclasses.asdict(d) for d in self._store.dropped],
            "seconds": time.perf_counter() - started,
        }
        if self._recovery["messages"] or self._store.dropped:
            logger.info("durable queue %d recovered from %s: %s", index, dirpath, self._recovery)

    def _wall_offset(self) -> float:
        """Wall clock minus the core's clock, now: a core time plus this is a persisted one."""
        return self._wall() - self._now()

    # -- housekeeping ---------------------------------------------------------------------------

    def _functions_swept(self, dropped: dict[bytes, bytes]) -> None:
        """The FUNC records of swept functions stay in the index, their segments pinned, until
        the next compaction writes an index without them: no index record says a function
        was dropped, so a segment deleted earlier would make a reopen report the FUNC record
        the index still names as corrupt. Once a segment's worth of them is swept, compact."""
        self._swept_func_bytes += sum(len(data) for data in dropped.values())
        if not self._compaction_due and self._swept_func_bytes >= self._store.max_segment_bytes:
            self._compaction_due = True
            self._wake_sweeper()

    def _housekeeping_due_in(self) -> float | None:
        return 0.0 if self._compaction_due else self._store.sync_due_in()

    async def _housekeeping(self) -> None:
        """The due interval sync, then the due compaction (off the loop, queue paused)."""
        self._sweep_functions_if_due()
        due = self._store.sync_due_in()
        if due is not None and due <= 0:
            self._syncs.start()
        if self._compaction_due:
            await self._compact_or_postpone()

    async def _compact_or_postpone(self) -> None:
        # The calls whose records grew the index were answered long ago: a failed compaction
        # is only logged. It changed nothing (see _compact); the next try waits for the index
        # to double.
        try:
            self._sweep_functions()  # compaction copies the used functions only
            await self._run_paused(self._compact)
        except StoreError as e:
            logger.warning("queue %d: compaction failed, postponed: %s", self.index, e)
            self._store.postpone_compaction()
        finally:
            self._compaction_due = False

    def _close_storage(self) -> None:
        try:
            self._take_journal()
            self._write_index()  # records a failed write left pending: a last try
        except StoreError as e:
            logger.warning("queue %d: records not written at close (a reopen redelivers those "
                           "messages): %s", self.index, e)
        finally:
            self._store.close()

    def _reopen_storage(self) -> None:
        """Open the directory again after a hand-off that did not happen: it holds what this
        actor's memory does (the hand-off wrote everything). Raises (a :class:`StoreError`) if
        another actor holds it: the hand-off then stays final."""
        old = self._store
        store = SegmentStore(old.dirpath, max_segment_bytes=old.max_segment_bytes, fsync=old.fsync,
                             fsync_interval_s=old.fsync_interval_s, compact_index_bytes=old.compact_index_bytes,
                             dir_mode=old.dir_mode)
        store.take_records()  # recovered already: the state in memory
        pins: dict[int, int] = {}
        refs = [seg for seg, _ in self._chunk_live.values()] + [seg for seg, _ in self._func_refs.values()]
        refs += [seg for seg, _ in self._dead_errors.values()] + [seg for seg in self._result_refs if seg]
        for seg in refs:
            pins[seg] = pins.get(seg, 0) + 1
        store.reset_pins(pins)
        self._store = store

    def _export_handoff(self, now: float) -> dict[str, Any]:
        """Everything is on disk but the live leases: the successor recovers the directory
        and keeps these leased (their holders settle them there)."""
        leases = [
            (lease.lease_id, lease.deadline - now, lease.owner, lease.started - now,
             [(s.chunk.base_seq, s.start, s.stop, s.attempts) for s in lease.spans])
            for lease in self._core.leases()
        ]
        return {"leases": leases, "fences": self._core.fences.snapshot(), "producers": self._producers.export(now)}

    # -- closing ---------------------------------------------------------------------------------

    async def close(self) -> None:
        """As :meth:`QueueActorBase.close`; the syncs started before wait off the loop first
        (closing the store waits for any started since, and syncs the rest)."""
        await self._syncs.idle()
        await super().close()

    # -- inspection ---------------------------------------------------------------------------

    async def recovery_report(self) -> dict[str, Any]:
        """What opening the directory found: messages, dead letters, results, losses.

        ``corruptions`` are the messages of the corrupt records reported (rule 5);
        ``dropped`` lists every byte range recovery gave up, as dicts with ``rule`` (3 torn
        write, 4 zero fill, 5 corruption), ``path``, ``offset``, ``bytes_dropped``, ``reason``.
        """
        return dict(
            self._recovery,
            corruptions=list(self._recovery["corruptions"]),
            dropped=[dict(d) for d in self._recovery["dropped"]],
        )

    async def disk_usage(self) -> dict[str, int]:
        """Bytes on disk, log segment count and index size (once the syncs started have
        deleted the segments they retire)."""
        await self._syncs.idle()
        await self._unpaused()
        return {
            "disk_bytes": self._store.disk_bytes(),
            "segments": len(self._store.segment_numbers()),
            "index_bytes": self._store.index_bytes,
        }

    async def compact(self) -> None:
        """Compact the index now (it also happens on its own past ``compact_index_bytes``).

        Runs off the event loop while the queue is paused; raises what the compaction raised
        (a :class:`StoreError`; the queue is then as it was).
        """
        await self._unpaused()
        if self._closed:
            raise QueueClosedError(f"queue {self.index} is closed")
        self._sweep_functions()  # compaction copies the used functions only
        await self._run_paused(self._compact)
        self._compaction_due = False


def _on_worker() -> bool:
    """Whether this runs on a Dask worker (an actor), where a held lock is worth waiting for;
    a queue opened by hand elsewhere fails at once."""
    try:
        from distributed import get_worker

        get_worker()
        return True
    except (ImportError, ValueError):
        return False
