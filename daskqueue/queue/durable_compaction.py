"""A durable queue's compaction: a new index written from the live state alone.

A part of :class:`daskqueue.queue.durable.DurableQueue` (a mixin over its state). Runs on a
thread of its own while the queue is paused (``QueueActorBase._run_paused``): nothing else
touches the queue meanwhile.
"""

from __future__ import annotations

from daskqueue.queue.core import Chunk
from daskqueue.queue.durable_bodies import MAX_ATTEMPTS_ON_DISK, encode_dead_body
from daskqueue.segment.format import IndexRecord, IndexType, LogType, token_record

__all__ = ["CompactionMixin"]


class CompactionMixin:
    """``_compact`` and its parts."""

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
        self._swept_func_bytes = 0
        store.reset_pins(pins)
        store.sync()

    def _copy_funcs(self, records: list[bytes], pins: dict[int, int]) -> dict[bytes, tuple[int, int]]:
        """The held functions only (those live messages and dead letters use, and newer):
        the FUNC records of swept ones are left behind, with the segments only they kept.
        A swept function used again comes back with a new FUNC record (``_on_put``)."""
        refs = {}
        for digest, data in self._funcs.held.items():
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
            records.append(IndexRecord(IndexType.DEAD, d.seq, 1, min(d.attempts, MAX_ATTEMPTS_ON_DISK), seg, off).to_bytes())
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
