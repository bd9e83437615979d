"""Splitting a batch's result record that is too big for one durable log record (no Dask)."""

from __future__ import annotations

import pickle

from daskqueue.messages import decode_error
from daskqueue.queue.durable import split_result_record
from daskqueue.serialize import ResultRecord


def _messages(records):
    """``(seq, value, failed, final_error)`` per message, in order, from result records."""
    out = []
    for record in records:
        values = pickle.loads(record.results)
        finals = record.final_errors or {}
        pos = 0
        for first, count in record.ranges:
            for k in range(count):
                out.append((first + k, values[pos + k], pos + k in record.failed, finals.get(pos + k)))
            pos += count
    return out


def test_pieces_keep_every_message_its_range_and_its_failure_positions():
    ranges = [(10, 30), (40, 50)]  # consecutive seqs from two put groups: never merged
    values = [bytes([i]) * 100 for i in range(80)]
    values[5] = None
    record = ResultRecord(3, ranges, [5], pickle.dumps(values), None)
    pieces = split_result_record(record, 2000)
    assert len(pieces) > 1
    assert all(len(p.to_bytes()) <= 2000 for p in pieces)
    assert _messages(pieces) == _messages([record])
    starts = {first for p in pieces for first, _ in p.ranges}
    assert 40 in starts  # the second group's range starts a run of its own


def test_a_single_result_too_big_becomes_a_final_payload_error_of_that_message():
    values = [b"small", b"x" * 10_000, b"small too"]
    record = ResultRecord(0, [(7, 3)], [], pickle.dumps(values), None)
    got = _messages(split_result_record(record, 2000))
    assert [(seq, value) for seq, value, _, _ in got] == [(7, b"small"), (8, None), (9, b"small too")]
    assert got[1][2] is True
    exc_type, message, _ = decode_error(got[1][3])
    assert "PayloadTooLargeError" in exc_type and "10,0" in message
