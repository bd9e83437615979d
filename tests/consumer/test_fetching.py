"""The fetch policy (``daskqueue.consumer.fetching``) against fake queue calls: what it keeps
per queue index must be of the queue's current actor, not of one it moved from."""

from __future__ import annotations

import asyncio

from daskqueue.consumer.counters import Counters
from daskqueue.consumer.fetching import FetchPolicy
from daskqueue.consumer.settling import Settler
from daskqueue.consumer.sizer import BatchSizer
from daskqueue.errors import QueueLostError


class FakeCalls:
    """Queue 0 (home) answers a long poll with a hint that queue 1 has work; a fetch from
    queue 1 waits until ``release`` is set, then fails as a call to a dead worker does."""

    def __init__(self) -> None:
        self.queues = {0: object(), 1: object()}
        self.release = asyncio.Event()
        self.at_queue_1 = asyncio.Event()

    async def call(self, slot, method, *args, wait_s=0.0, **kwargs):
        if slot == 0:
            return [(1, 7)]
        self.at_queue_1.set()
        await self.release.wait()
        raise QueueLostError(1, "tcp://127.0.0.1:1", "durable")


def policy(calls: FakeCalls) -> FetchPolicy:
    counters = Counters()
    settler = Settler(0, calls, counters, lease_timeout_s=30.0, held=list)  # type: ignore[arg-type]
    sizer = BatchSizer(fixed=10, initial=10, max_size=10, target_batch_s=1.0)
    return FetchPolicy(0, calls, sizer, counters, settler, home=0, idle_poll_s=0.05,  # type: ignore[arg-type]
                       reserved_priority=10, func_bytes={}, stopping=lambda: False)


async def _fetch_failing_at_queue_1(moved: bool) -> FetchPolicy:
    calls = FakeCalls()
    fetcher = policy(calls)
    assert await fetcher.fetch() is None  # home hinted queue 1
    second = asyncio.ensure_future(fetcher.fetch())  # goes to queue 1 and waits there
    await asyncio.wait_for(calls.at_queue_1.wait(), 5)
    if moved:
        fetcher.queue_back(1)  # the pool: queue 1 was reopened on another worker
    calls.release.set()  # the call to its old actor fails now
    assert await asyncio.wait_for(second, 5) is None
    return fetcher


async def test_a_call_to_a_moved_queues_old_actor_that_fails_late_does_not_make_it_skipped():
    fetcher = await _fetch_failing_at_queue_1(moved=True)
    assert not fetcher.is_down(1)


async def test_a_call_that_fails_with_no_move_in_between_makes_the_queue_skipped():
    fetcher = await _fetch_failing_at_queue_1(moved=False)
    assert fetcher.is_down(1)
