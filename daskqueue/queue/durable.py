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
from daskqueue.messages import error_from_exception
from daskqueue.queue.base import TOKENS_KEPT, ChunkPayload, QueueActorBase, detach_payload
from daskqueue.queue.core import LEASE_EXPIRED, Chunk, JournalEntry, Span, Transition
from daskqueue.queue.syncing import LoopSyncs, answers_when_durable
from daskqueue.segment.format import MAX_NAME_BYTES, PAYLOAD_OFFSET, ChunkHeader, IndexRecord, IndexType, LogType, token_record
from daskqueue.segment.recovery import Recovered, replay
from daskqueue.segment.store import FsyncPolicy, SegmentStore
from daskqueue.serialize import PROTOCOL, ChunkMeta, Group, ResultRecord

__all__ = ["DurableQueue"]

logger = logging.getLogger("daskqueue")

_MAX_ATTEMPTS_ON_DISK = 255  # the index record's attempts field is a u8

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
class DurableQueue(QueueActorBase):
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
        if self._core.max_retries >= _MAX_ATTEMPTS_ON_DISK:
            raise ValueError(f"max_retries must be < {_MAX_ATTEMPTS_ON_DISK} for a durable queue")
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
        try:
            recovered = replay(self._store.take_records(), self._store.read_log, self._store.report)
            state = pickle.loads(handoff) if handoff is not None else {"leases": [], "fences": {}}
            self._restore(recovered, state["leases"])
            self._fences = state["fences"]  # the actor's copy, until it reads the core's by source
            for source, keys in self._fences.items():
                self._core.fence_from(source, keys)
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

    # -- recovery -----------------------------------------------------------------------------

    def _restore(self, rec: Recovered, adopted: list[Any] = ()) -> None:  # type: ignore[assignment]
        now = self._now()
        wall_offset = self._wall_offset()
        pins: dict[int, int] = {}
        fixes: list[IndexRecord] = []
        held, accepted = _adoptable(rec, adopted)  # base_seq -> [(start, stop)] of live leases
        # The dead letters first, under their ordinals: a client's cursor counts them, and
        # the letters rule 6 makes below must come after every one handed out before.
        self._restore_dead(rec, now)
        chunks: dict[int, Chunk] = {}
        for rc in rec.chunks:
            h = rc.header
            payload = ChunkPayload(rc.offsets, rc.data, rc.segment, rc.offset)
            chunk = chunks[h.base_seq] = Chunk(h.base_seq, h.count, h.priority, payload,
                                               ChunkMeta(h.kind, h.digest, h.type, h.key, h.time_limit_s), type=h.type,
                                               key=h.key)
            self._core.restore(chunk, rc.spans, now=now, not_before=(h.not_before - wall_offset) or None)
            live = sum(stop - start for start, stop, _ in rc.spans)
            for start, stop, attempts in _minus(rc.crashed_leases, held.get(h.base_seq, [])):
                record = self._restore_crashed(chunk, start, stop, attempts, now)
                fixes.append(record)
                if record.type == IndexType.RETRY:
                    live += stop - start
            live += sum(stop - start for start, stop in held.get(h.base_seq, []))
            if live:  # a chunk rule 6 dead-lettered entirely pins nothing
                self._chunk_live[h.base_seq] = [rc.segment, live]
                pins[rc.segment] = pins.get(rc.segment, 0) + 1
        for digest, (data, seg, off) in rec.funcs.items():
            self._funcs[digest] = data
            self._func_refs[digest] = (seg, off)
        self._restore_results(rec)
        for lease_id, deadline_in, owner, started_in, spans in adopted:
            if lease_id in accepted:
                self._core.restore_lease(
                    lease_id, [Span(chunks[base], start, stop, attempts) for base, start, stop, attempts in spans],
                    deadline=now + deadline_in, owner=owner, started=now + started_in,
                )
        self._tokens = dict(list(rec.tokens.items())[-TOKENS_KEPT:])
        self._core.advance_seq(rec.next_seq)
        self._core.rebuild_key_holders()  # a retried keyed message still runs before its key's next
        for seg in list(self._func_refs.values()) + list(self._dead_errors.values()):
            pins[seg[0]] = pins.get(seg[0], 0) + 1
        for seg in self._result_refs:
            if seg:
                pins[seg] = pins.get(seg, 0) + 1
        self._store.reset_pins(pins)
        # Persist what rule 6 decided, so a second crash does not count the attempt twice.
        self._core.journal = []
        self._write_index(fixes)
        self._after_change(now)
        self._store.sync()

    def _restore_dead(self, rec: Recovered, now: float) -> None:
        wall_offset = self._wall() - now
        bodies: dict[tuple[int, int], Any] = {}  # one ERROR record serves a span's letters
        for seq, attempts, body, seg, off, ordinal in rec.dead:
            decoded = bodies.get((seg, off))
            if decoded is None:
                decoded = bodies[(seg, off)] = read_dead_body(body)
            error, wall, meta, priority, payload = dead_letter_from(decoded, seq)
            self._core.restore_dead(seq, attempts, error, meta, payload=payload, priority=priority,
                                    at=(wall - wall_offset) if wall else now, ordinal=ordinal)
            self._dead_errors[seq] = (seg, off)
        self._core.advance_dead(rec.next_dead)

    def _restore_results(self, rec: Recovered) -> None:
        """The unfetched result records, numbered as before; one lost to corruption is an
        empty record, so the numbering (the client's cursor) stays."""
        expected = rec.results[0][0] if rec.results else rec.next_result
        self._results_base = expected
        for number, blob, seg, _ in rec.results:
            while expected < number:
                self._results.append(ResultRecord(self.index, [], [], pickle.dumps([]), None))
                self._result_refs.append(0)
                expected += 1
            self._results.append(ResultRecord.from_bytes(blob))  # also a plain tuple (older stores)
            self._result_refs.append(seg)
            expected += 1
        self._next_result = max(rec.next_result, expected)

    def _restore_crashed(self, chunk: Chunk, start: int, stop: int, attempts: int, now: float) -> IndexRecord:
        """Rule 6: a span leased at the crash is ready again with one more attempt, or dead."""
        first = chunk.base_seq + start
        if attempts > self._core.max_retries:
            self._core.restore(chunk, [], now=now)
            for i in range(start, stop):
                self._core.restore_dead(chunk.base_seq + i, attempts, LEASE_EXPIRED, chunk.meta,
                                        payload=detach_payload(chunk, i), priority=chunk.priority, at=now)
            seg, off = self._store.append_log(LogType.ERROR, encode_dead_body(LEASE_EXPIRED, chunk, start, stop))
            for i in range(start, stop):
                self._dead_errors[chunk.base_seq + i] = (seg, off)
            return IndexRecord(IndexType.DEAD, first, stop - start, attempts, seg, off)
        self._core.restore(chunk, [(start, stop, attempts)], now=now)
        return IndexRecord(IndexType.RETRY, first, stop - start, attempts)

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

    def _housekeeping_due_in(self) -> float | None:
        return 0.0 if self._compaction_due else self._store.sync_due_in()

    async def _housekeeping(self) -> None:
        """The due interval sync, then the due compaction (off the loop, queue paused)."""
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

    def _export_handoff(self, now: float) -> dict[str, Any]:
        """Everything is on disk but the live leases: the successor recovers the directory
        and keeps these leased (their holders settle them there)."""
        leases = [
            (lease.lease_id, lease.deadline - now, lease.owner, lease.started - now,
             [(s.chunk.base_seq, s.start, s.stop, s.attempts) for s in lease.spans])
            for lease in self._core.leases()
        ]
        return {"leases": leases, "fences": self._fences}

    # -- compaction ---------------------------------------------------------------------------

    def _compact(self) -> None:
        """Rewrite the index with only live state; copy small live log records forward.

        Runs on its own thread, through ``_run_paused`` only: nothing else touches the queue
        meanwhile. The queue's references and the store's pins change only once the new index
        is in place: a compaction that fails (a full disk) leaves both as they were, and the
        copies it appended are bytes no index names. Records still pending are appended to
        the old index first (the new one is written from the state they describe).

        It keeps records encoded and groups spans by sorting, not in new containers: few
        long-lived objects, so it does not set off a full garbage collection, which holds
        the GIL (and the event loop) for a pass over the whole heap.
        """
        store = self._store
        # What the journal and pending records say is in the queue's state, which the new
        # index is written from: write them first, or a later append would repeat them.
        self._take_journal()
        self._write_index()
        next_result = self._results_base + len(self._results)
        records = [IndexRecord(IndexType.WATERMARK, self._core.next_seq, 0, 0, 0, next_result).to_bytes()]
        pins: dict[int, int] = {}
        func_refs = self._copy_funcs(records, pins)
        self._chunk_records(records, pins)
        dead_errors = self._copy_dead(records, pins)
        result_refs = self._copy_results(records, pins)
        records.extend(token_record(t, first, n).to_bytes() for t, (first, n) in self._tokens.items())
        store.replace_index(records)
        self._func_refs, self._dead_errors, self._result_refs = func_refs, dead_errors, result_refs
        store.reset_pins(pins)
        store.sync()

    def _copy_funcs(self, records: list[bytes], pins: dict[int, int]) -> dict[bytes, tuple[int, int]]:
        refs = {}
        for digest, data in self._funcs.items():
            seg, off = self._store.append_log(LogType.FUNC, digest, data)
            refs[digest] = (seg, off)
            records.append(IndexRecord(IndexType.FUNC, 0, 0, 0, seg, off).to_bytes())
            pins[seg] = pins.get(seg, 0) + 1
        return refs

    def _chunk_records(self, records: list[bytes], pins: dict[int, int]) -> None:
        """Each chunk with live messages: its CHUNK record, ACKs for the settled gaps, and the
        RETRY/LEASE records of its live spans."""
        spans = self._core.live_spans()
        # Two stable sorts with int keys: by chunk, then by position in it. (Tuple keys would
        # be as many new objects as spans, the kind of growth that sets off a collection.)
        spans.sort(key=lambda x: x[0].start)
        spans.sort(key=lambda x: x[0].chunk.base_seq)
        chunk, cursor = None, 0
        for span, state in spans:
            if span.chunk is not chunk:
                self._end_chunk(records, chunk, cursor)
                chunk, cursor = span.chunk, 0
                seg, off = chunk.payload.segment, chunk.payload.offset
                records.append(IndexRecord(IndexType.CHUNK, chunk.base_seq, chunk.count, 0, seg, off).to_bytes())
                pins[seg] = pins.get(seg, 0) + 1
            if span.start > cursor:
                records.append(IndexRecord(IndexType.ACK, chunk.base_seq + cursor, span.start - cursor).to_bytes())
            if span.attempts:
                records.append(IndexRecord(IndexType.RETRY, span.first_seq, span.count, span.attempts).to_bytes())
            if state == "leased":
                records.append(IndexRecord(IndexType.LEASE, span.first_seq, span.count, span.attempts).to_bytes())
            cursor = span.stop
        self._end_chunk(records, chunk, cursor)

    @staticmethod
    def _end_chunk(records: list[bytes], chunk: Chunk | None, cursor: int) -> None:
        """The ACK for a chunk's settled messages after its last live span."""
        if chunk is not None and cursor < chunk.count:
            records.append(IndexRecord(IndexType.ACK, chunk.base_seq + cursor, chunk.count - cursor).to_bytes())

    def _copy_dead(self, records: list[bytes], pins: dict[int, int]) -> dict[int, tuple[int, int]]:
        """The dead letters, each under its ordinal: replay numbers DEAD records in order, so
        a DEAD_ORDINAL record says where the count resumes after a gap (letters taken out),
        and a last one keeps the next ordinal past every letter handed out."""
        refs: dict[int, tuple[int, int]] = {}
        now = self._now()
        ordinal = 0
        for d in self._core.dead:
            if d.ordinal != ordinal:
                records.append(IndexRecord(IndexType.DEAD_ORDINAL, d.ordinal).to_bytes())
            body = encode_dead_body(d.error, d.chunk, d.index, d.index + 1, wall=self._wall() - (now - d.at))
            seg, off = refs[d.seq] = self._store.append_log(LogType.ERROR, body)
            records.append(IndexRecord(IndexType.DEAD, d.seq, 1, min(d.attempts, _MAX_ATTEMPTS_ON_DISK), seg, off).to_bytes())
            pins[seg] = pins.get(seg, 0) + 1
            ordinal = d.ordinal + 1
        if self._core.dead_appended != ordinal:
            records.append(IndexRecord(IndexType.DEAD_ORDINAL, self._core.dead_appended).to_bytes())
        return refs

    def _copy_results(self, records: list[bytes], pins: dict[int, int]) -> list[int]:
        refs = []
        for k, record in enumerate(self._results):
            seg, off = self._store.append_log(LogType.RESULT, record.to_bytes())
            records.append(IndexRecord(IndexType.RESULT, self._results_base + k, 0, 0, seg, off).to_bytes())
            refs.append(seg)
            pins[seg] = pins.get(seg, 0) + 1
        return refs

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
        await self._run_paused(self._compact)
        self._compaction_due = False


def _check_names(group: Group) -> None:
    for what, name in (("type", group.type), ("routing key", group.key)):
        size = len(name.encode()) if name else 0
        if size > MAX_NAME_BYTES:
            raise ConfigurationError(f"a message {what} of {size:,} bytes is longer than the "
                                     f"{MAX_NAME_BYTES:,} a durable queue stores")


def _adoptable(rec: Recovered, adopted: list[Any]) -> tuple[dict[int, list[tuple[int, int]]], set[int]]:
    """The handed-over leases whose every span recovery found leased (rule 6 would make
    them ready again): ``base_seq -> [(start, stop)]`` of their spans, and their ids. A lease
    with a span it did not find is left to rule 6 whole."""
    crashed = {rc.header.base_seq: rc.crashed_leases for rc in rec.chunks}
    held: dict[int, list[tuple[int, int]]] = {}
    accepted = set()
    for lease_id, _, _, _, spans in adopted:
        if all(any(a <= start and stop <= b for a, b, _ in crashed.get(base, ())) for base, start, stop, _ in spans):
            accepted.add(lease_id)
            for base, start, stop, _ in spans:
                held.setdefault(base, []).append((start, stop))
    return held, accepted


def _minus(runs: list[tuple[int, int, int]], held: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The parts of ``(start, stop, attempts)`` runs outside the ``held`` intervals."""
    out = []
    for start, stop, attempts in runs:
        cursor = start
        for a, b in sorted(held):
            if b <= cursor or a >= stop:
                continue
            if a > cursor:
                out.append((cursor, a, attempts))
            cursor = max(cursor, b)
        if cursor < stop:
            out.append((cursor, stop, attempts))
    return out


def split_result_record(record: ResultRecord, limit: int) -> list[ResultRecord]:
    """Split a result record into records whose stored form (``to_bytes``) is at most
    ``limit`` bytes each, keeping their messages in order.

    A single message whose result alone is too big becomes a final failure of that message
    (a :class:`PayloadTooLargeError` the client reports): it ran and is acked, but its result
    cannot be kept.
    """
    values = pickle.loads(record.results)
    failed_set, final_errors = set(record.failed), dict(record.final_errors or {})
    # Each message's seq and the range it came from: ranges are never merged, even when
    # consecutive (the client maps each range to one put group).
    seqs = [(first + k, r) for r, (first, count) in enumerate(record.ranges) for k in range(count)]
    out: list[ResultRecord] = []

    def piece(lo: int, hi: int) -> ResultRecord:
        runs: list[tuple[int, int]] = []
        last = None
        for seq, r in seqs[lo:hi]:
            if r == last:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((seq, 1))
                last = r
        fails = [p - lo for p in range(lo, hi) if p in failed_set]
        finals = {p - lo: final_errors[p] for p in range(lo, hi) if p in final_errors}
        return ResultRecord(record.queue, runs, fails, pickle.dumps(values[lo:hi], PROTOCOL), finals or None,
                            record.consumer)

    def emit(lo: int, hi: int) -> None:
        rec = piece(lo, hi)
        if len(rec.to_bytes()) <= limit:
            out.append(rec)
        elif hi - lo > 1:
            mid = (lo + hi) // 2
            emit(lo, mid)
            emit(mid, hi)
        else:
            size = len(pickle.dumps(values[lo], PROTOCOL))
            error = error_from_exception(PayloadTooLargeError(size, limit))
            out.append(ResultRecord(record.queue, [(seqs[lo][0], 1)], [0], pickle.dumps([None], PROTOCOL), {0: error},
                                    record.consumer))

    emit(0, len(seqs))
    return out


#: The start of an ERROR log record that holds a dead letter's message too (its payload and
#: meta, and when it died): the dead letter can be listed, replayed and kept across restarts.
#: An ERROR record without it holds only the error (older stores; read as before).
DEAD_BODY_MAGIC = b"DQDEAD2\x00"


def encode_dead_body(error: bytes, chunk: Chunk, start: int, stop: int, wall: float | None = None) -> bytes:
    """The ERROR record of messages ``start .. stop`` of ``chunk`` dead-lettered with ``error``."""
    payload, meta = chunk.payload, chunk.meta
    offsets = payload.offsets[start : stop + 1] if payload is not None else None
    data = b""
    rebased = b""
    if offsets is not None:
        data = bytes(payload.data[offsets[0] : offsets[-1]])
        rebased = array("I", [o - offsets[0] for o in offsets]).tobytes()
    meta_tuple = tuple(meta) if meta is not None else None
    body = (error, time.time() if wall is None else wall, meta_tuple, chunk.priority, chunk.base_seq + start,
            rebased, data)
    return DEAD_BODY_MAGIC + pickle.dumps(body, PROTOCOL)


def decode_dead_body(body: bytes, seq: int) -> tuple[bytes, float, ChunkMeta | None, int, ChunkPayload | None]:
    """``(error, wall time, meta, priority, payload)`` of dead letter ``seq`` from its ERROR
    record (an older record: the error only, the rest unknown)."""
    return dead_letter_from(read_dead_body(body), seq)


def read_dead_body(body: bytes) -> tuple[Any, ...]:
    """The decoded fields of an ERROR record (decode once per record, not per letter)."""
    if not body.startswith(DEAD_BODY_MAGIC):
        return (body, 0.0, None, 0, 0, b"", b"")
    return pickle.loads(body[len(DEAD_BODY_MAGIC):])


def dead_letter_from(fields: tuple[Any, ...], seq: int) -> tuple[bytes, float, ChunkMeta | None, int, ChunkPayload | None]:
    """Dead letter ``seq``'s part of a decoded ERROR record."""
    error, wall, meta, priority, first, rebased, data = fields
    payload = None
    if rebased:
        offs = array("I")
        offs.frombytes(rebased)
        i = seq - first
        payload = ChunkPayload(array("I", [0, offs[i + 1] - offs[i]]), data[offs[i] : offs[i + 1]])
    return error, wall, ChunkMeta(*meta) if meta is not None else None, priority, payload


def _on_worker() -> bool:
    """Whether this runs on a Dask worker (an actor), where a held lock is worth waiting for;
    a queue opened by hand elsewhere fails at once."""
    try:
        from distributed import get_worker

        get_worker()
        return True
    except (ImportError, ValueError):
        return False
