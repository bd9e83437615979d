"""A durable queue's core runs on the monotonic clock, like a transient one's; only what is
persisted (not-before times of delayed messages, dead-letter times) is wall clock, converted
at the boundary. A wall-clock step (NTP, a VM resumed) then neither expires leases nor makes
delayed messages due early."""

from __future__ import annotations

import time

from daskqueue.queue.durable import DurableQueue
from daskqueue.segment.recovery import decode_chunk
from tests.segment.helpers import get, open_queue, put

DELAY_S = 30.0
CLOSE_S = 5.0  # generous: the test's own calls in between


async def test_leases_and_delays_are_on_the_monotonic_clock(tmp_path):
    q = open_queue(tmp_path, lease_timeout_s=60.0)
    await put(q, ["now"])
    await put(q, ["later"], delay_s=DELAY_S)
    lease_id, _ = await get(q, 1)
    lease = q._core.lease(lease_id)
    assert abs(lease.deadline - (time.monotonic() + 60.0)) < CLOSE_S
    ((not_before, _),) = q._core.delayed()
    assert abs(not_before - (time.monotonic() + DELAY_S)) < CLOSE_S
    await q.close()


async def test_a_delayed_message_is_persisted_with_its_wall_clock_due_time(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["later"], delay_s=DELAY_S)
    ((span, _),) = q._core.live_spans()
    _, body = q._store.read_log(span.chunk.payload.segment, span.chunk.payload.offset)
    header, _, _ = decode_chunk(body)
    assert abs(header.not_before - (time.time() + DELAY_S)) < CLOSE_S
    await q.close()


class OtherProcess(DurableQueue):
    """A reopen in another process: its monotonic clock has another origin."""

    @staticmethod
    def _now() -> float:
        return time.monotonic() + 123_456.0


async def test_a_reopen_with_another_monotonic_origin_keeps_the_delay(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["later"], delay_s=DELAY_S)
    await q.close()
    q = OtherProcess(0, str(tmp_path), fsync="never")
    ((not_before, _),) = q._core.delayed()
    assert abs(not_before - (q._now() + DELAY_S)) < CLOSE_S
    assert await get(q, 1) == (None, [])
    await q.close()
