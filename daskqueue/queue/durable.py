"""The durable queue actor: the queue shell over a segment store (``daskqueue/segment``)."""

from __future__ import annotations

import dataclasses
import logging
import pickle
import time
from array import array
from typing import Any

from daskqueue import defaults
from daskqueue.errors import ConfigurationError, PayloadTooLargeError, QueueClosedError, StoreError
from daskqueue.queue.base import QueueActorBase
from daskqueue.queue.core import Chunk, JournalEntry, Span, Transition
from daskqueue.queue.durable_bodies import (  # re-exported: other modules import them from here
    DEAD_BODY_MAGIC,
    MAX_ATTEMPTS_ON_DISK,
    decode_dead_body,
    encode_dead_body,
    split_result_record,
)
from daskqueue.queue.durable_compaction import CompactionMixin
from daskqueue.queue.durable_recovery import RecoveryMixin
from daskqueue.queue.syncing import LoopSyncs, answers_when_durable
from daskqueue.segment.format import MAX_NAME_BYTES, PAYLOAD_OFFSET, ChunkHeader, IndexRecord, IndexType, LogType, token_record
from daskqueue.segment.recovery import replay
from daskqueue.segment.store import FsyncPolicy, SegmentStore
from daskqueue.serialize import Group, ResultRecord

__all__ = ["DurableQueue", "split_result_record", "encode_dead_body", "decode_dead_body", "DEAD_BODY_MAGIC"]

logger = logging.getLogger("daskqueue")


#: The index record that persists each of the core's transitions.
_RECORD_OF = {
    Transition.LEASE: IndexType.LEASE,
    Transition.RELEASE: IndexType.RELEASE,
    Transition.ACK: IndexType.ACK,
    Transition.RETRY: IndexType.RETRY,
    Transition.DEAD: IndexType.DEAD,
    Transition.DEAD_DROP: IndexType.DEAD_DROP,
}
_OFFSET = PAYLOAD_OFFSET.size


# Under fsync="always" these answer only once their writes are synced (off the loop).
@answers_when_durable("put_batch", "adopt", "get_batch", "get_batch_nowait", "settle", "record_outcomes",
                      "fetch_results", "fetch_outcomes", "workers_lost", "replay_dead", "purge", "move_out")
class DurableQueue(RecoveryMixin, CompactionMixin, QueueActorBase):
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

    # -- writing through ----------------------------------------------------------------------

    def _fit_groups(self, groups: list[Group]) -> list[Group]:
        """Split groups whose CHUNK record would not fit in one log segment. Raises
        :class:`ConfigurationError` for a type or key longer than a CHUNK header holds
        (before the put changes anything)."""
        out = []
        for g in groups:
            _check_names(g)
            # A CHUNK body is its header (with type and key), count + 1 offsets, the payloads.
            limit = self._store.max_record_body - ChunkHeader.encoded_size(g.type, g.key)
            if len(g.data) + _OFFSET * (g.count + 1) <= limit:
                out.append(g)
                continue
            offs = array("I")
            offs.frombytes(g.offsets)
            start = 0
            while start < g.count:
                stop = start + 1
                if offs[stop] - offs[start] > limit - 2 * _OFFSET:  # one message, two offsets
                    raise PayloadTooLargeError(offs[stop] - offs[start], limit - 2 * _OFFSET)
                while stop < g.count and offs[stop + 1] - offs[start] + _OFFSET * (stop + 2 - start) <= limit:
                    stop += 1
                sub = array("I", (o - offs[start] for o in offs[start : stop + 1]))
                out.append(Group(g.kind, g.digest, g.type, g.priority, g.key, g.delay_s, stop - start,
                                 sub.tobytes(), g.data[offs[start] : offs[stop]], g.due_epoch, g.time_limit_s))
                start = stop
        return out

    def _on_put(self, chunks: list[tuple[Chunk, float]], funcs: dict[bytes, bytes], now: float,
                token: bytes | None, ranges: list[tuple[int, int]]) -> None:
        records = []
        wall_offset = self._wall_offset()
        for digest, data in funcs.items():
            if digest in self._func_refs:
                # Swept, used again before a compaction dropped its FUNC record: the index
                # still names that one (and its segment is pinned). A second record would
                # leave one of the two unpinned, its segment deleted under the index.
                continue
            seg, off = self._store.append_log(LogType.FUNC, digest, data)
            records.append(IndexRecord(IndexType.FUNC, 0, 0, 0, seg, off))
            self._func_refs[digest] = (seg, off)
            self._store.pin(seg)
        for chunk, delay_s in chunks:
            payload, meta = chunk.payload, chunk.meta
            not_before = now + wall_offset + delay_s if delay_s > 0 else 0.0  # persisted: wall clock
            header = ChunkHeader(chunk.base_seq, chunk.count, chunk.priority, meta.kind, meta.digest, meta.type,
                                 meta.key, not_before, meta.time_limit_s)
            seg, off = self._store.append_log(LogType.CHUNK, header.to_bytes(), payload.offsets.tobytes(), payload.data)
            chunk.payload = payload.stored_at(seg, off)
            records.append(IndexRecord(IndexType.CHUNK, chunk.base_seq, chunk.count, 0, seg, off))
        if token is not None and ranges:
            # After the CHUNKs, in the same append: a token on disk means its put is there.
            records.append(token_record(token, ranges[0][0], sum(n for _, n in ranges)))
        self._write_index(records)  # the put counts from here: a crash before it loses it
        for chunk, _ in chunks:
            seg = chunk.payload.segment
            self._chunk_live[chunk.base_seq] = [seg, chunk.count]
            self._store.pin(seg)
        self._commit()

    def _after_change(self, now: float) -> None:
        """Persist the journal (after the records already pending), then commit.

        If storage refuses, the call that caused the change raises and everything not written
        stays pending, in order, for the next write that succeeds (see the class docstring).
        """
        if not self._core.journal and not self._pending:
            return
        self._take_journal()
        self._write_index()
        self._commit()
        if not self._compaction_due and self._store.needs_compaction():
            # Compacting takes time in proportion to the live state: never inline in a call.
            self._compaction_due = True
            self._wake_sweeper()

    def _take_journal(self) -> None:
        """Turn the core's journal into pending index records, each entry exactly once: an
        entry leaves the journal only once its record (and a DEAD's error log record) exist."""
        journal = self._core.journal
        taken = 0
        try:
            for entry in journal:
                self._pending.append(self._index_record(entry))
                taken += 1
        finally:
            del journal[:taken]

    def _index_record(self, entry: JournalEntry) -> IndexRecord:
        """The index record of a journal entry; a DEAD's error goes to the log first."""
        span = entry.span
        seg = off = 0
        if entry.kind == Transition.DEAD:
            body = encode_dead_body(entry.error, span.chunk, span.start, span.stop)
            try:
                seg, off = self._store.append_log(LogType.ERROR, body)
            except PayloadTooLargeError:  # a span of big messages: the error alone, payloads lost
                logger.warning("queue %d: %d dead letters too large to keep with their payloads",
                               self.index, span.count)
                seg, off = self._store.append_log(LogType.ERROR, entry.error)
            for seq in range(span.first_seq, span.first_seq + span.count):
                self._dead_errors[seq] = (seg, off)
                self._store.pin(seg)
        elif entry.kind == Transition.DEAD_DROP:
            for seq in range(span.first_seq, span.first_seq + span.count):
                ref = self._dead_errors.pop(seq, None)
                if ref is not None:
                    self._unpins.append(ref[0])
        if entry.kind in (Transition.ACK, Transition.DEAD):
            self._settled(span)
        wall = entry.time + self._wall_offset() if entry.time else 0.0  # a RETRY's due time, persisted
        return IndexRecord(_RECORD_OF[entry.kind], span.first_seq, span.count, span.attempts, seg, off, wall)

    def _write_index(self, records: list[IndexRecord] | None = None) -> None:
        """Append the pending records, then ``records``, in one write; then unpin what they
        settled. On a :class:`StoreError` nothing changes: the pending records stay pending
        (a later write puts them first) and ``records`` are not written."""
        batch = self._pending + records if records else self._pending
        if not batch:
            return
        self._store.append_index(batch)
        self._pending = []
        unpins, self._unpins = self._unpins, []
        for seg in unpins:
            self._store.unpin(seg)

    def _commit(self) -> None:
        """End of a call's writes; the syncs they need run on the store's sync thread."""
        if self._store.commit():  # a new interval sync is pending: the sweeper must plan it
            self._wake_sweeper()
        if self._store.fsync == "always":
            self._syncs.start()  # the call's answer waits for it (answers_when_durable)
        elif self._store.reclaim_due():
            self._syncs.start(index_only=True)

    def _settled(self, span: Span) -> None:
        """Count ``span`` settled; its chunk's segment is unpinned once the chunk's last live
        message is, and the record saying so is in the index (``_write_index``)."""
        entry = self._chunk_live.get(span.chunk.base_seq)
        if entry is None:
            return
        entry[1] -= span.count
        if entry[1] <= 0:
            del self._chunk_live[span.chunk.base_seq]
            self._unpins.append(entry[0])

    def _add_result(self, record: ResultRecord) -> None:
        data = record.to_bytes()
        if len(data) > self._store.max_record_body:
            # A batch's results can outgrow a log segment: store them in pieces.
            for piece in split_result_record(record, self._store.max_record_body):
                self._add_result_record(piece, piece.to_bytes())
        else:
            self._add_result_record(record, data)

    def _add_result_record(self, record: ResultRecord, data: bytes) -> None:
        number = self._results_base + len(self._results)
        seg, off = self._store.append_log(LogType.RESULT, data)
        # Written with the ACKs in one append, before them: a torn write keeps the results
        # and loses the acks (the messages run again), never the other way round.
        self._pending.append(IndexRecord(IndexType.RESULT, number, 0, 0, seg, off))
        self._store.pin(seg)
        self._results.append(record)
        self._result_refs.append(seg)

    def _drop_results(self, n: int) -> None:
        # Unpinned once the drop is in the index, after any RESULT records still pending.
        self._unpins.extend(seg for seg in self._result_refs[:n] if seg)
        del self._result_refs[:n]
        super()._drop_results(n)
        self._pending.append(IndexRecord(IndexType.RESULT_DROP, self._results_base))
        self._write_index()
        self._commit()

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
        return {"leases": leases, "fences": self._core.fences.snapshot()}

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


def _check_names(group: Group) -> None:
    for what, name in (("type", group.type), ("routing key", group.key)):
        size = len(name.encode()) if name else 0
        if size > MAX_NAME_BYTES:
            raise ConfigurationError(f"a message {what} of {size:,} bytes is longer than the "
                                     f"{MAX_NAME_BYTES:,} a durable queue stores")


def _on_worker() -> bool:
    """Whether this runs on a Dask worker (an actor), where a held lock is worth waiting for;
    a queue opened by hand elsewhere fails at once."""
    try:
        from distributed import get_worker

        get_worker()
        return True
    except (ImportError, ValueError):
        return False
