"""A durable queue's recovery: the state replayed from its directory
(``daskqueue.segment.recovery``) brought into the queue core, by FORMAT.md's rules.

A part of :class:`daskqueue.queue.durable.DurableQueue` (a mixin over its state); runs in its
``__init__``, off the event loop.
"""

from __future__ import annotations

import pickle
from typing import Any

from daskqueue.queue.base import TOKENS_KEPT, ChunkPayload, detach_payload
from daskqueue.queue.core import LEASE_EXPIRED, Chunk, Span
from daskqueue.queue.durable_bodies import dead_letter_from, encode_dead_body, read_dead_body
from daskqueue.segment.format import IndexRecord, IndexType, LogType
from daskqueue.segment.recovery import Recovered
from daskqueue.serialize import ChunkMeta, ResultRecord

__all__ = ["RecoveryMixin"]


class RecoveryMixin:
    """``_restore`` and its parts."""

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
                                               ChunkMeta(h.kind, h.digest, h.type, h.key, h.time_limit_s,
                                                         h.producer), type=h.type,
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
        self._funcs.add({digest: data for digest, (data, _, _) in rec.funcs.items()})
        for digest, (_, seg, off) in rec.funcs.items():
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
        # Every FUNC record the index names was loaded (and stays pinned until a compaction
        # leaves the unused ones behind); those no message uses go to the idle table now.
        self._sweep_functions()
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
