"""A type or routing key longer than a CHUNK header holds (a u16 length) is refused by a
durable queue with a typed error before the put changes anything: no sequence numbers, no
FUNC record pinned, nothing written."""

from __future__ import annotations

import pytest

from daskqueue.errors import ConfigurationError
from daskqueue.messages import Kind
from daskqueue.segment.format import MAX_NAME_BYTES
from daskqueue.serialize import Group, encode_put, pack_payloads
from tests.segment.helpers import drain, open_queue, put

DIGEST = b"\x07" * 16


def blob_with(*, type_=None, key=None) -> bytes:
    offsets, data = pack_payloads(["x"], max_message_bytes=2**20)
    group = Group(Kind.RAW, DIGEST, type_, 0, key, 0.0, 1, offsets, data)
    return encode_put([group], {DIGEST: b"a pickled function"})


@pytest.mark.parametrize("field", ["type_", "key"])
async def test_a_name_too_long_for_the_disk_format_is_refused_before_anything_changes(tmp_path, field):
    q = open_queue(tmp_path)
    await put(q, ["before"])
    seq, index_bytes, log_end = q._core.next_seq, q._store.index_bytes, q._store.active.end
    with pytest.raises(ConfigurationError, match="bytes is longer than"):
        await q.put_batch(blob_with(**{field: "k" * (MAX_NAME_BYTES + 1)}))
    assert (q._core.next_seq, q._store.index_bytes, q._store.active.end) == (seq, index_bytes, log_end)
    assert q._func_refs == {} and DIGEST not in q._funcs
    await q.put_batch(blob_with(**{field: "k" * MAX_NAME_BYTES}))  # the longest that fits
    await q.close()
    assert sorted(v for v, _ in (await drain(open_queue(tmp_path))).values()) == ["before", "x"]
