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
