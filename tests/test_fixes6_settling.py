"""Lease extension when one extend call is slow: the next tick extends again, and the lease
does not expire. In this process, no cluster: a real ``TransientQueue`` behind a handle that
looks remote (calls to it get a deadline) and whose first ``extend`` never answers in time."""

from __future__ import annotations

import asyncio

import pytest

from daskqueue.consumer.calls import QueueCalls
from daskqueue.consumer.counters import Counters
from daskqueue.consumer.settling import Settler
from daskqueue.queue.transient import TransientQueue
from tests.helpers import wait_until_async
from tests.segment.helpers import get, put

pytestmark = pytest.mark.timeout(60)


class SlowOnce:
    """Queue ``queue`` on another worker, whose first ``extend`` hangs (a slow worker)."""

    _address = "tcp://10.255.0.9:1"

    def __init__(self, queue: TransientQueue) -> None:
        self.queue = queue
        self.extended: list[list[int]] = []  # the leases each answered extend had lost

    async def extend(self, lease_ids):
        if not self.extended and not getattr(self, "slowed", False):
            self.slowed = True
            await asyncio.sleep(60)
        lost = await self.queue.extend(lease_ids)
        self.extended.append(lost)
        return lost


async def test_one_slow_extend_call_does_not_let_the_lease_expire():
    # Lease of 1.5 s, extended every 0.5 s. The extend at 0.5 s hangs: given up at its
    # deadline, the tick at 1.0 s must extend again. With a deadline of a whole period the
    # call ended just after that tick, which skipped the queue; the next extend came at 1.5 s,
    # as the lease expired.
    lease_timeout_s = 1.5
    q = TransientQueue(0, lease_timeout_s=lease_timeout_s)
    await put(q, ["a"])
    lease_id, items = await get(q)
    assert items
    slow = SlowOnce(q)
    queue_calls = QueueCalls({0: slow})
    queue_calls.bind()
    settler = Settler(0, queue_calls, Counters(), lease_timeout_s=lease_timeout_s, held=lambda: [(0, lease_id)])
    extending = asyncio.get_running_loop().create_task(settler.extend_forever())
    try:
        await wait_until_async(lambda: len(slow.extended) >= 2, timeout_s=30)
    finally:
        extending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await extending
    assert slow.extended[:2] == [[], []]  # both extended a live lease
    assert (await q.stats()).total_expired == 0
