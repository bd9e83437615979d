"""On threads (``isolation="thread"``), a batch fetched ahead is handed to the thread pool's
start gate at once: the thread whose batch ends starts it there and then, with no round
trip to the event loop; one taken back or past its latest start comes back unrun and is
given back. The run slots driven off any cluster, with a fetcher and a settler of the
test's own (no Dask here: the slots' contract with them is a few async calls)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from daskqueue.consumer.batch import Batch, Outcome
from daskqueue.consumer.counters import Counters
from daskqueue.consumer.running import RunSlots, SlotConfig
from daskqueue.consumer.sizer import BatchSizer
from daskqueue.consumer.walltime import WalltimeGuard
from tests.helpers import wait_until_async


class ListFetcher:
    """Hands out the given batches, then nothing."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = list(batches)

    async def fetch(self, limit: int | None = None) -> Batch | None:
        if self.batches:
            return self.batches.pop(0)
        await asyncio.sleep(0.01)
        return None


class RecordingSettler:
    def __init__(self) -> None:
        self.settled: list[int] = []
        self.given_back: list[int] = []

    async def settle(self, batch: Batch, outcome: Outcome, *, early: bool) -> None:
        self.settled.append(batch.lease_id)

    async def give_back(self, slot: int, lease_id: int) -> None:
        self.given_back.append(lease_id)

    async def extend_forever(self) -> None:
        await asyncio.Event().wait()


def batches(n: int) -> list[Batch]:
    return [Batch(0, 0, lease_id, [], 1) for lease_id in range(n)]


def slots_of(fetcher: ListFetcher, settler: RecordingSettler, run_on_thread) -> RunSlots:
    sizer = BatchSizer(fixed=1, initial=1, max_size=1, target_batch_s=0.1)
    return RunSlots(0, SlotConfig(max_concurrency=1, prefetch_batches=1, reserved_slots=0, early_ack=False),
                    fetcher, settler, sizer, Counters(), run_on_thread=run_on_thread,  # type: ignore[arg-type]
                    orphaned=lambda: False, close_orphan=lambda: None)


async def stop(slots: RunSlots) -> None:
    slots.stop_requested = True
    await slots.join()
    slots.shutdown()


@pytest.mark.timeout(60)
def test_the_batch_fetched_ahead_starts_when_the_thread_frees_even_while_the_event_loop_is_busy():
    started: dict[int, float] = {}
    loop_free_at: list[float] = []

    def block_the_loop() -> None:
        time.sleep(2.0)  # the worker's loop, busy when the first batch ends (settling, a put...)
        loop_free_at.append(time.monotonic())

    async def body() -> None:
        loop = asyncio.get_running_loop()

        def run_on_thread(batch: Batch) -> tuple[Outcome, float]:
            started[batch.lease_id] = time.monotonic()
            if batch.lease_id == 0:
                time.sleep(0.2)  # the second batch is fetched meanwhile
                loop.call_soon_threadsafe(block_the_loop)
            return Outcome(1, {}, set(), [batch.lease_id]), 0.0

        settler = RecordingSettler()
        slots = slots_of(ListFetcher(batches(2)), settler, run_on_thread)
        slots.start()
        try:
            await wait_until_async(lambda: sorted(settler.settled) == [0, 1], timeout_s=30)
        finally:
            await stop(slots)

    asyncio.run(body())
    # The second batch did not wait for the loop to hear that the first one ended.
    assert started[1] < loop_free_at[0]


@pytest.mark.timeout(60)
def test_a_batch_waiting_for_a_thread_past_its_latest_start_or_at_a_stop_is_given_back_unrun():
    ran: list[int] = []
    release = threading.Event()

    def run_on_thread(batch: Batch) -> tuple[Outcome, float]:
        ran.append(batch.lease_id)
        release.wait(30)
        return Outcome(1, {}, set(), [batch.lease_id]), 0.0

    async def body() -> None:
        settler = RecordingSettler()
        slots = slots_of(ListFetcher(batches(3)), settler, run_on_thread)
        # The worker leaves soon: what waits for the thread past then may not start.
        guard = WalltimeGuard(time.time() + 2.0, slots.walltime.durations, margin_s=1.0)
        slots.walltime.guard = guard
        slots.start()
        try:
            await wait_until_async(lambda: ran == [0] and slots.held() == [(0, 0), (0, 1)], timeout_s=30)
            await wait_until_async(lambda: guard.done(time.time()), timeout_s=30)
            release.set()  # the thread frees only now: batch 1 is late
            await wait_until_async(lambda: settler.given_back == [1] and settler.settled == [0], timeout_s=30)
            assert slots.walltime.given_back == 1
            # Without an end, the next batch runs as usual.
            release.clear()
            slots.walltime.guard = None
            await wait_until_async(lambda: ran == [0, 2], timeout_s=30)
        finally:
            release.set()
            await stop(slots)
        assert ran == [0, 2] and settler.settled == [0, 2]

    asyncio.run(body())


@pytest.mark.timeout(60)
def test_a_stopping_consumer_takes_back_the_batch_waiting_for_its_thread_while_its_item_runs():
    ran: list[int] = []
    release = threading.Event()

    def run_on_thread(batch: Batch) -> tuple[Outcome, float]:
        ran.append(batch.lease_id)
        release.wait(30)
        return Outcome(1, {}, set(), [batch.lease_id]), 0.0

    async def body() -> None:
        settler = RecordingSettler()
        slots = slots_of(ListFetcher(batches(2)), settler, run_on_thread)
        slots.start()
        try:
            await wait_until_async(lambda: ran == [0] and len(slots.held()) == 2, timeout_s=30)
            slots.stop_requested = True
            # Given back while the first item still runs.
            await wait_until_async(lambda: settler.given_back == [1], timeout_s=30)
            assert ran == [0] and settler.settled == []
        finally:
            release.set()
            await stop(slots)
        assert ran == [0] and settler.settled == [0]

    asyncio.run(body())
