"""The wire blobs of one task's path carry no enum members (each costs a module look-up and a
Python call to read, on the path of every single task's latency)."""

from __future__ import annotations

import pickle
import pickletools

import pytest

from daskqueue.messages import Kind
from daskqueue.queue.encode import PutOptions, encode_calls
from daskqueue.serialize import decode_put, encode_put


def _noop(x):
    return x


def _globals_named(blob: bytes) -> list[str]:
    """The classes and functions a pickle names (what unpickling must look up)."""
    names, strings = [], []
    for op, arg, _ in pickletools.genops(blob):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            names.append(".".join(strings[-2:]))
        elif op.name == "GLOBAL":
            names.append(arg)
    return names


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kwargs", [None, {"y": 1}])
def test_put_blob_names_no_class(kwargs):
    (batch,) = encode_calls([(_noop, (1,), kwargs)], PutOptions(), size=1, limit=1 << 20, batches=1)
    blob = encode_put(batch.groups, {})
    assert _globals_named(blob) == []
    (group,) = decode_put(blob)[1]
    assert group.kind == (Kind.CALL_KW if kwargs else Kind.CALL)
    assert type(group.kind) is int
    assert pickle.loads(blob)[1][0][0] == group.kind


@pytest.mark.timeout(30)
def test_a_delivery_blob_names_no_class_and_decodes_to_segments():
    from daskqueue.serialize import Segment, decode_delivery, encode_delivery

    segment = Segment(3, 2, 1, int(Kind.CALL), b"d" * 16, "t", 5, None, b"\0" * 12, b"xy", 1.5, 7)
    blob = encode_delivery(9, 4, [segment, segment._replace(first_seq=5)])
    assert _globals_named(blob) == []
    lease_id, queue_index, segments = decode_delivery(blob)
    assert (lease_id, queue_index) == (9, 4)
    assert segments == [segment, segment._replace(first_seq=5)]
    assert all(type(s) is Segment for s in segments)
    assert segments[1].first_seq == 5 and segments[0].time_limit_s == 1.5 and segments[0].producer == 7


@pytest.mark.timeout(30)
def test_an_outcome_polls_records_name_no_class_and_decode_to_records():
    import asyncio

    from daskqueue.queue.transient import TransientQueue
    from daskqueue.serialize import (Group, ResultRecord, TaggedResultRecord, decode_delivery, decode_records,
                                     encode_records, encode_settle, pack_payloads)

    async def main() -> tuple[bytes, bytes]:
        q = TransientQueue(0)
        try:
            offsets, data = pack_payloads(["a"], max_message_bytes=2**20)
            await q.put_batch(encode_put([Group(Kind.RAW, None, None, 0, None, 0.0, 1, offsets, data)], {}))
            lease_id, _, _ = decode_delivery(await q.get_batch(10))
            await q.settle(lease_id, encode_settle(1, {}, set(), pickle.dumps(["r"])))
            _, blob, _, _ = await q.fetch_outcomes(0, 0)
            _, kept = await q.fetch_results(0)
            return blob, kept
        finally:
            await q.close()

    blob, kept = asyncio.run(main())
    assert _globals_named(blob) == []
    (record,) = decode_records(blob)
    assert type(record) is ResultRecord and record.ranges == [(0, 1)] and pickle.loads(record.results) == ["r"]
    assert decode_records(kept) == [record]  # fetch_results keeps its pickled records
    tagged = TaggedResultRecord(1, [(5, 2)], [1], b"x", None, 3, 9)
    assert decode_records(encode_records([record, tagged])) == [record, tagged]
    assert [type(r) for r in decode_records(encode_records([record, tagged]))] == [ResultRecord, TaggedResultRecord]
