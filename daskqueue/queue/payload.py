"""The bytes of the messages a queue actor holds, and the shapes they travel in.

A queue stores payloads as it got them (one ``ChunkPayload`` per put group: one pickle per
message, or one packed pickle of the whole group's payloads, see :mod:`daskqueue.serialize`)
and never unpickles them; these functions cut them into what leaves the queue: a delivery segment for a
consumer, a put group for another queue (a move, a replayed dead letter), one message's bytes
for its dead letter. Pure functions of their arguments: no Dask, no clock, no I/O.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from daskqueue.queue.core import Chunk, Lease, Span
from daskqueue.serialize import Group, PackedRef, Segment, packed_item_pickle

__all__ = ["ChunkPayload", "detach_payload", "packed_payload", "delivery_segment", "moved_group", "ran_ranges",
           "ranges_of"]


@dataclass(frozen=True, slots=True)
class ChunkPayload:
    """The bytes of a chunk's messages (``Chunk.payload`` in a queue actor).

    ``offsets`` holds ``count + 1`` uint32 offsets into ``data``, the payloads concatenated. A
    durable queue replaces it by ``stored_at(segment, offset)`` once its CHUNK log record is
    written: ``segment`` is None until then.

    A packed payload (``packed`` > 0, memory queues only): ``data`` is one pickle of a list of
    ``packed`` payloads, message ``i`` of the chunk is its item ``first + i``, and ``offsets``
    is empty. Parts of one packed chunk (moved, dead-lettered) share the ``data`` object.
    """

    offsets: array
    data: bytes
    segment: int | None = None
    offset: int = 0
    packed: int = 0
    first: int = 0

    def stored_at(self, segment: int, offset: int) -> ChunkPayload:
        """The same payload, whose CHUNK log record is at ``offset`` of log ``segment``."""
        return ChunkPayload(self.offsets, self.data, segment, offset, self.packed, self.first)

    def message_bytes(self, i: int) -> bytes:
        """Message ``i``'s payload as one pickle of its own (of a packed payload: a pickle
        that unpickles the blob and takes the item, see ``packed_item_pickle``)."""
        if self.packed:
            return packed_item_pickle(self.data, self.first + i)
        return bytes(self.data[self.offsets[i] : self.offsets[i + 1]])

    def listed(self, i: int) -> bytes | PackedRef:
        """Message ``i``'s payload for a dead-letter listing: its bytes, or (packed) a
        :class:`~daskqueue.serialize.PackedRef` sharing this chunk's blob."""
        if self.packed:
            return PackedRef(self.data, self.first + i)
        return bytes(self.data[self.offsets[i] : self.offsets[i + 1]])

    def nbytes(self, start: int, stop: int) -> int:
        """Payload bytes of messages ``start .. stop`` (of a packed payload: their share of
        the blob)."""
        if self.packed:
            return len(self.data) * (stop - start) // self.packed
        return self.offsets[stop] - self.offsets[start]


def detach_payload(chunk: Chunk, i: int) -> ChunkPayload:
    """The payload of message ``i`` of ``chunk`` alone (what its dead letter keeps, so that
    one dead message does not keep its whole put batch in memory; of a packed chunk, the
    packed blob, bounded by ``PACK_MAX_BYTES`` and shared, and the message's index in it)."""
    p = chunk.payload
    if p.packed:
        return ChunkPayload(_NO_OFFSETS, p.data, packed=p.packed, first=p.first + i)
    a, b = p.offsets[i], p.offsets[i + 1]
    return ChunkPayload(array("I", [0, b - a]), bytes(p.data[a:b]))


def packed_payload(data: bytes, packed: int, first: int) -> ChunkPayload:
    """The payload of a packed put group (see :class:`ChunkPayload`)."""
    return ChunkPayload(_NO_OFFSETS, data, packed=packed, first=first)


#: The offsets of a packed payload: none (shared, never written to).
_NO_OFFSETS = array("I")


def delivery_segment(span: Span) -> Segment:
    """The delivery segment of a leased span: its offsets and its slice of the payloads (of
    a packed chunk: the whole blob and where the span's messages are in it)."""
    payload, meta = span.chunk.payload, span.chunk.meta
    if payload.packed:
        return Segment(
            span.first_seq, span.count, span.attempts, meta.kind, meta.digest, meta.type,
            span.chunk.priority, meta.key, b"", payload.data, getattr(meta, "time_limit_s", 0.0),
            getattr(meta, "producer", 0), payload.packed, payload.first + span.start,
        )
    offs = payload.offsets[span.start : span.stop + 1]
    return Segment(
        span.first_seq, span.count, span.attempts, meta.kind, meta.digest, meta.type,
        span.chunk.priority, meta.key, offs.tobytes(), payload.data[offs[0] : offs[-1]],
        getattr(meta, "time_limit_s", 0.0), getattr(meta, "producer", 0),
    )


def moved_group(span: Span, delay_s: float) -> Group:
    """A put group of ``span``'s messages for another queue, due in ``delay_s`` (of a packed
    chunk: the same blob, the span's index range in it)."""
    payload, meta = span.chunk.payload, span.chunk.meta
    time_limit_s, producer = getattr(meta, "time_limit_s", 0.0), getattr(meta, "producer", 0)
    if payload.packed:
        return Group(meta.kind, meta.digest, meta.type, span.chunk.priority, meta.key, delay_s, span.count,
                     b"", payload.data, 0.0, time_limit_s, producer, payload.packed, payload.first + span.start)
    offs = payload.offsets[span.start : span.stop + 1]
    base = offs[0]
    offsets = array("I", [o - base for o in offs])
    return Group(meta.kind, meta.digest, meta.type, span.chunk.priority, meta.key, delay_s, span.count,
                 offsets.tobytes(), bytes(payload.data[base : offs[-1]]), 0.0, time_limit_s, producer)


def ran_ranges(lease: Lease, done: int) -> list[tuple[int, int]]:
    """``(first_seq, count)`` of the first ``done`` messages of ``lease``, in order."""
    ranges = []
    left = done
    for span in lease.spans:
        if left <= 0:
            break
        n = min(span.count, left)
        ranges.append((span.first_seq, n))
        left -= n
    return ranges


def ranges_of(stored: tuple[int, int], groups: list[Any]) -> list[tuple[int, int]]:
    """The answer to a retried put: its groups' ranges from the first put's first seq (the
    messages of one put have consecutive seqs)."""
    first, count = stored
    if sum(g.count for g in groups) != count:
        raise ValueError(f"a put token was reused for another put ({count} messages before)")
    ranges = []
    for g in groups:
        ranges.append((first, g.count))
        first += g.count
    return ranges
