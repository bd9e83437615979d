"""A queue being removed is asked every pass (``close_if_drained``, ``forward_records``)
which records its attached producers have not fetched: with none known, it must not scan
all its records (the owner's, maybe a million) on its event loop each time. In this process,
no cluster: a real ``TransientQueue``; the scan is counted (calls per record), not timed."""

from __future__ import annotations

import pickle

import pytest

from daskqueue.queue import moving
from daskqueue.queue.transient import TransientQueue

pytestmark = pytest.mark.timeout(60)

N = 2000


async def with_records(producers):
    """A queue holding one outcome record per entry of ``producers`` (their tags)."""
    q = TransientQueue(0)
    for i, producer in enumerate(producers):
        await q.record_outcomes([(i, 1)], {}, pickle.dumps([i]), 0, [producer])
    return q


@pytest.fixture
def looked_at(monkeypatch):
    """How many records ``_unforwarded`` looked at (its calls of record_producer)."""
    seen = []
    real = moving.record_producer

    def counted(record):
        seen.append(record)
        return real(record)

    monkeypatch.setattr(moving, "record_producer", counted)
    return seen


async def test_a_queue_with_no_attached_producer_does_not_scan_its_records_every_pass(looked_at):
    q = await with_records([0] * N)
    assert await q.forward_records(1) == 0
    first = len(looked_at)
    for _ in range(5):
        assert await q.forward_records(1) == 0
    assert len(looked_at) == first  # before the fix: N more per call
    await q.record_outcomes([(N, 1)], {}, pickle.dumps([N]), 0, [0])  # one more: only it is looked at
    assert await q.forward_records(1) == 0
    assert len(looked_at) == first + 1
    assert await q.close_if_drained()


async def test_a_record_of_an_attached_producer_is_still_found_among_the_owners():
    q = await with_records([0] * N)
    assert q._unforwarded() == []
    await q.record_outcomes([(N, 1)], {}, pickle.dumps([N]), 0, [7])  # producer 7, not heard of by a fetch yet
    assert [number for number, _ in q._unforwarded()] == [N]
    assert not await q.close_if_drained()
    await q.forget_producer(7)
    assert q._unforwarded() == []
    assert await q.close_if_drained()
