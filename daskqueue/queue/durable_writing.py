"""A durable queue's writes: each call's changes (new chunks, the core's journal, results)
become log and index records, written through in one append before the call is answered.

A part of :class:`daskqueue.queue.durable.DurableQueue` (a mixin over its state, like
``durable_recovery`` and ``durable_compaction``). What a failed write leaves pending, and when
it goes out, is the class docstring's contract there.
"""

from __future__ import annotations

import logging
from array import array

from daskqueue.errors import ConfigurationError, PayloadTooLargeError
from daskqueue.queue.core import Chunk, JournalEntry, Span, Transition
from daskqueue.queue.durable_bodies import encode_dead_body, split_result_record
from daskqueue.segment.format import (MAX_NAME_BYTES, PAYLOAD_OFFSET, ChunkHeader, IndexRecord, IndexType, LogType,
                                      token_record)
from daskqueue.serialize import Group, ResultRecord

__all__ = ["WritingMixin"]

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


class WritingMixin:
    """``_fit_groups``, ``_on_put``, ``_after_change``, the results' records, and their parts."""

    def _fit_groups(self, groups: list[Group]) -> list[Group]:
        """Split groups whose CHUNK record would not fit in one log segment. Raises
        :class:`ConfigurationError` for a type or key longer than a CHUNK header holds
        (before the put changes anything)."""
        out = []
        for g in groups:
            _check_names(g)
            # A CHUNK body is its header (with type and key), count + 1 offsets, the payloads.
            limit = self._store.max_record_body - ChunkHeader.encoded_size(g.type, g.key, g.producer)
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
                                 sub.tobytes(), g.data[offs[start] : offs[stop]], g.due_epoch, g.time_limit_s,
                                 g.producer))
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
                                 meta.key, not_before, meta.time_limit_s, getattr(meta, "producer", 0))
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


def _check_names(group: Group) -> None:
    for what, name in (("type", group.type), ("routing key", group.key)):
        size = len(name.encode()) if name else 0
        if size > MAX_NAME_BYTES:
            raise ConfigurationError(f"a message {what} of {size:,} bytes is longer than the "
                                     f"{MAX_NAME_BYTES:,} a durable queue stores")
