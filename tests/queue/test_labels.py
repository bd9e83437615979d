"""A message's type and key on a real durable pool: one a queue cannot store is refused at the
caller, before anything is sent (it used to raise ``struct.error`` inside the queue)."""

from __future__ import annotations

import pytest

from daskqueue.errors import FieldTooLongError
from tests import tasks

TOO_LONG = "t" * 2**16


def test_a_too_long_type_or_key_is_refused_before_anything_is_sent(pools, tmp_path):
    qp = pools.queue(1, durability="durable", dirpath=tmp_path / "pool")
    with pytest.raises(FieldTooLongError, match="type is 65,536 bytes"):
        qp.submit(tasks.double, 1, dq_type=TOO_LONG)
    with pytest.raises(FieldTooLongError, match="key is 65,536 bytes"):
        qp.put_many([1, 2], key=TOO_LONG)
    with pytest.raises(FieldTooLongError, match="key is 65,536 bytes"):
        qp.put_many([1, 2], keys=["fine", TOO_LONG])
    assert [s.total_put for s in qp.stats()] == [0]
    assert qp.put("ok", key="k" * 100) is not None  # the queue still takes what fits
    assert [s.total_put for s in qp.stats()] == [1]
