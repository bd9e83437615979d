"""Replay of index records into the state to restore (FORMAT.md recovery rules 5-8).

Pure: reads log records through the ``read_log`` function it is given and reports corruption
through ``report``; no clock, no queue, no Dask.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from dataclasses import dataclass, field
from typing import Callable

from daskqueue.errors import CorruptRecordError
from daskqueue.segment.format import (
    DIGEST_SIZE,
    PAYLOAD_OFFSET,
    ChunkHeader,
    IndexRecord,
    IndexType,
    LogType,
    record_token,
)

__all__ = ["Recovered", "RecoveredChunk", "replay", "decode_chunk", "READY", "LEASED", "ACKED", "DEAD"]

READY, LEASED, ACKED, DEAD = 0, 1, 2, 3
_STATE = {
    IndexType.LEASE: LEASED,
    IndexType.ACK: ACKED,
    IndexType.RETRY: READY,
    IndexType.RELEASE: READY,
    IndexType.DEAD: DEAD,
}

ReadLog = Callable[[int, int], tuple[LogType, bytes]]


@dataclass(eq=False)
class _ChunkState:
    segment: int
    offset: int
    count: int
    state: bytearray
    attempts: bytearray


@dataclass(eq=False)
class RecoveredChunk:
    """A chunk with unsettled messages: its header, payload, and the spans to restore."""

    header: ChunkHeader
    segment: int
    offset: int
    offsets: array
    data: bytes
    spans: list[tuple[int, int, int]]  # (start, stop, attempts), relative to the chunk
    crashed_leases: list[tuple[int, int, int]]  # spans that were LEASED: (start, stop, new attempts)


@dataclass(eq=False)
class Recovered:
    """Everything a durable queue restores, and what recovery had to give up."""

    chunks: list[RecoveredChunk] = field(default_factory=list)
    # seq, attempts, error, seg, off, ordinal; in ordinal order
    dead: list[tuple[int, int, bytes, int, int, int]] = field(default_factory=list)
    funcs: dict[bytes, tuple[bytes, int, int]] = field(default_factory=dict)  # digest -> data, seg, off
    results: list[tuple[int, bytes, int, int]] = field(default_factory=list)  # number, blob, seg, off
    tokens: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # put token -> (first, count)
    next_seq: int = 0
    next_result: int = 0
    next_dead: int = 0  # the ordinal of the next dead letter: past every one ever written
    lost_messages: int = 0


def replay(
    records: list[IndexRecord],
    read_log: ReadLog,
    report: Callable[[CorruptRecordError], None],
) -> Recovered:
    """Apply ``records`` in order; load the log records that live state needs."""
    out = Recovered()
    chunks: dict[int, _ChunkState] = {}
    bases: list[int] = []
    dead_refs: list[tuple[int, int, int, int, int]] = []
    func_refs: list[tuple[int, int]] = []
    result_refs: dict[int, tuple[int, int]] = {}
    dropped: set[int] = set()  # dead letters purged or replayed (DEAD_DROP)
    for r in records:
        t = r.type
        if t == IndexType.CHUNK:
            if r.first not in chunks:
                bisect.insort(bases, r.first)
            chunks[r.first] = _ChunkState(r.segment, r.offset, r.count, bytearray(r.count), bytearray(r.count))
            out.next_seq = max(out.next_seq, r.first + r.count)
        elif t in _STATE:
            out.next_seq = max(out.next_seq, r.first + r.count)
            if t == IndexType.DEAD:  # its letters take the next ordinals, in index order
                for k in range(r.count):
                    dead_refs.append((r.first + k, r.attempts, r.segment, r.offset, out.next_dead + k))
                out.next_dead += r.count
            chunk, rel = _find(chunks, bases, r.first)
            if chunk is None:
                continue  # the chunk was settled and compacted away
            chunk.state[rel : rel + r.count] = bytes([_STATE[t]]) * r.count
            if t == IndexType.RETRY:
                chunk.attempts[rel : rel + r.count] = bytes([r.attempts]) * r.count
        elif t == IndexType.FUNC:
            func_refs.append((r.segment, r.offset))
        elif t == IndexType.RESULT:
            result_refs[r.first] = (r.segment, r.offset)
            out.next_result = max(out.next_result, r.first + 1)
        elif t == IndexType.RESULT_DROP:
            for number in [n for n in result_refs if n < r.first]:
                del result_refs[number]
            out.next_result = max(out.next_result, r.first)
        elif t == IndexType.WATERMARK:
            out.next_seq = max(out.next_seq, r.first)
            out.next_result = max(out.next_result, r.offset)
        elif t == IndexType.TOKEN:
            out.tokens[record_token(r)] = (r.first, r.count)
        elif t == IndexType.DEAD_DROP:
            dropped.update(range(r.first, r.first + r.count))
        elif t == IndexType.DEAD_ORDINAL:
            out.next_dead = max(out.next_dead, r.first)
    for base in bases:
        _restore_chunk(out, base, chunks[base], read_log, report)
    if dropped:
        dead_refs = [d for d in dead_refs if d[0] not in dropped]
    _load_rest(out, dead_refs, func_refs, result_refs, read_log, report)
    return out


def _find(chunks: dict[int, _ChunkState], bases: list[int], seq: int) -> tuple[_ChunkState | None, int]:
    i = bisect.bisect(bases, seq) - 1
    if i < 0:
        return None, 0
    chunk = chunks[bases[i]]
    rel = seq - bases[i]
    return (chunk, rel) if rel < chunk.count else (None, 0)


def _restore_chunk(
    out: Recovered, base: int, chunk: _ChunkState, read_log: ReadLog, report: Callable[[CorruptRecordError], None]
) -> None:
    live = chunk.count - chunk.state.count(ACKED) - chunk.state.count(DEAD)
    if live == 0:
        return  # every message settled: the log record is not even read
    try:
        kind, body = read_log(chunk.segment, chunk.offset)
        if kind != LogType.CHUNK:
            raise CorruptRecordError(f"segment {chunk.segment}", chunk.offset, "not a CHUNK record", 0)
        header, offsets, data = decode_chunk(body)
        if header.base_seq != base or header.count != chunk.count:
            raise CorruptRecordError(f"segment {chunk.segment}", chunk.offset, "CHUNK record does not match its index record", 0)
    except CorruptRecordError as e:
        report(e)
        out.lost_messages += live
        return
    spans: list[tuple[int, int, int]] = []
    crashed: list[tuple[int, int, int]] = []
    if chunk.state.count(READY) == chunk.count and chunk.attempts.count(0) == chunk.count:
        spans.append((0, chunk.count, 0))  # the common case: nothing happened to it yet
    else:
        pos = 0
        for (state, attempts), run in itertools.groupby(zip(chunk.state, chunk.attempts)):
            n = sum(1 for _ in run)
            if state == LEASED:  # rule 6: running at the crash: one more attempt
                crashed.append((pos, pos + n, attempts + 1))
            elif state == READY:  # rule 8
                spans.append((pos, pos + n, attempts))
            pos += n  # rule 7: ACKED and DEAD stay settled
    out.chunks.append(RecoveredChunk(header, chunk.segment, chunk.offset, offsets, data, spans, crashed))


def decode_chunk(body: bytes | memoryview) -> tuple[ChunkHeader, array, bytes]:
    """Split a CHUNK record body into its header, payload offsets and payload data."""
    header, at = ChunkHeader.from_bytes(body)
    offsets = array("I")
    n = PAYLOAD_OFFSET.size * (header.count + 1)
    offsets.frombytes(bytes(body[at : at + n]))
    return header, offsets, bytes(body[at + n :])


def _load_rest(
    out: Recovered,
    dead_refs: list[tuple[int, int, int, int, int]],
    func_refs: list[tuple[int, int]],
    result_refs: dict[int, tuple[int, int]],
    read_log: ReadLog,
    report: Callable[[CorruptRecordError], None],
) -> None:
    errors: dict[tuple[int, int], bytes] = {}
    for seq, attempts, seg, off, ordinal in dead_refs:
        if (seg, off) not in errors:
            errors[(seg, off)] = _read_or(read_log, report, seg, off, b"daskqueue.LostError\x00error text lost to corruption\x00")
        out.dead.append((seq, attempts, errors[(seg, off)], seg, off, ordinal))
    for seg, off in func_refs:
        body = _read_or(read_log, report, seg, off, None)
        if body is not None:
            out.funcs[body[:DIGEST_SIZE]] = (body[DIGEST_SIZE:], seg, off)
    for number in sorted(result_refs):
        seg, off = result_refs[number]
        body = _read_or(read_log, report, seg, off, None)
        if body is not None:
            out.results.append((number, body, seg, off))


def _read_or(read_log: ReadLog, report: Callable[[CorruptRecordError], None], seg: int, off: int, default):  # type: ignore[no-untyped-def]
    try:
        return bytes(read_log(seg, off)[1])
    except CorruptRecordError as e:
        report(e)
        return default
