"""The bodies of a durable queue's own log records: dead letters (ERROR records that keep
the message too) and results split to fit a segment. Pure encoding, no store."""

from __future__ import annotations

import pickle
import time
from array import array
from typing import Any

from daskqueue.errors import PayloadTooLargeError
from daskqueue.messages import error_from_exception
from daskqueue.queue.base import ChunkPayload
from daskqueue.queue.core import Chunk
from daskqueue.queue.producer_results import record_producer
from daskqueue.serialize import PROTOCOL, ChunkMeta, ResultRecord

__all__ = ["MAX_ATTEMPTS_ON_DISK", "split_result_record", "DEAD_BODY_MAGIC", "encode_dead_body", "decode_dead_body",
           "read_dead_body", "dead_letter_from"]

MAX_ATTEMPTS_ON_DISK = 255  # the index record's attempts field is a u8


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
                            record.consumer).tagged(record_producer(record))

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
                                    record.consumer).tagged(record_producer(record)))

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
