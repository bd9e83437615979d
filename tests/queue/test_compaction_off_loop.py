"""A durable queue's compaction runs off the event loop, with the queue paused.

Real files and real ``DurableQueue`` objects driven with asyncio (as in ``tests/segment``):
the loop stays responsive while a large index is compacted, calls made meanwhile wait for it
and then answer from the compacted state, and nothing is lost across a reopen.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import pickle
import time

import pytest

from daskqueue.messages import Kind
from daskqueue.serialize import Group, encode_put, encode_settle, pack_payloads
from tests.segment.helpers import background_done, crash, drain, get, open_queue, put

TICK_S = 0.01


def many_chunks_blob(n: int) -> bytes:
    """One put of ``n`` groups of one message each: ``n`` chunks, ``n`` CHUNK index records."""
    offsets, data = pack_payloads(["m"], max_message_bytes=1024)
    group = Group(Kind.RAW, None, None, 0, None, 0.0, 1, offsets, data)
    return encode_put([group] * n, {})


async def build(q, n_chunks: int, n_results: int) -> None:
    """``n_chunks`` live chunks, then ``n_results`` unfetched 2 KB results (copied forward)."""
    for _ in range(n_chunks // 5000):
        await q.put_batch(many_chunks_blob(5000))
    for _ in range(n_results):
        lease, items = await get(q, 1)
        await q.settle(lease, encode_settle(1, {}, set(), pickle.dumps([b"r" * 2000])))


class LoopWatch:
    """Sleeps ``TICK_S`` in a loop and records the largest lateness of a wakeup (counting the
    one still pending on exit: a stall just before it must not go unseen)."""

    def __init__(self) -> None:
        self.max_gap_s = 0.0
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopWatch:
        self._task = asyncio.get_running_loop().create_task(self._watch())
        await asyncio.sleep(2 * TICK_S)  # a tick or two: watching before the measured code runs
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._record(time.perf_counter())
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _watch(self) -> None:
        self._last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK_S)
            self._record(time.perf_counter())

    def _record(self, now: float) -> None:
        self.max_gap_s = max(self.max_gap_s, now - self._last - TICK_S)
        self._last = now


@pytest.fixture
def frozen_heap():
    """Keep what exists now out of full garbage collections until the test ends.

    A full collection holds the GIL for a pass over every tracked object of the process (with
    60k live chunks, ~150 ms), whichever thread's allocation sets it off: the loop meets those
    pauses during ordinary puts too. Freezing the heap built so far leaves only the stalls
    that compaction itself causes to be measured.
    """
    yield lambda: (gc.collect(), gc.freeze())
    gc.unfreeze()


async def test_automatic_compaction_of_a_large_queue_leaves_the_event_loop_responsive(tmp_path, frozen_heap):
    q = open_queue(tmp_path)
    await build(q, n_chunks=60_000, n_results=1500)
    frozen_heap()
    generation = q._store.generation
    q._store.compact_index_bytes = 0  # the next write crosses the threshold
    async with LoopWatch() as watch:
        started = time.perf_counter()
        lease, _ = await get(q, 1)  # its LEASE record makes compaction due
        call_s = time.perf_counter() - started
        assert q._store.generation == generation  # due, not done: the call did not compact
        await background_done(q)  # the sweeper runs the compaction, off the loop
        compaction_s = time.perf_counter() - started
    assert q._store.generation == generation + 1
    # The bound that matters: the loop never stalled for long. Inline compaction stalled it
    # for the whole compaction_s (1-2 s here). 0.35 s, not 0.2: the suite runs this file first,
    # beside two other heavy ones on 2 cores, and the OS alone then gave a 0.21 s gap in CI.
    assert watch.max_gap_s < min(0.35, compaction_s / 3), (watch.max_gap_s, compaction_s)
    assert call_s < compaction_s / 3, (call_s, compaction_s)
    crash(q)
    q = open_queue(tmp_path)
    assert (await q.stats()).ready == 60_000 - 1500  # the leased one is back (rule 6)
    end, blob = await q.fetch_results(0)
    assert end == 1500 and len(pickle.loads(blob)) == 1500


async def test_calls_made_during_a_compaction_wait_for_it_and_answer_from_its_result(tmp_path):
    # 10,000 chunks: a compaction of ~0.1 s, thousands of times the loop turn the calls below
    # need to be made (they are made while the queue is paused, asserted; more chunks only
    # lengthened the build, the drain and the reopen).
    n = 10_000
    q = open_queue(tmp_path)
    await build(q, n_chunks=n, n_results=10)
    leased, _ = await get(q, 5)
    results = pickle.dumps(list(range(5)))
    generation = q._store.generation
    waiting_outcome = asyncio.ensure_future(q.fetch_outcomes(10, 0, wait_s=5.0))  # nothing new yet
    await asyncio.sleep(0)  # one loop turn, not a wait: the fetch is waiting before compaction
    compaction = asyncio.ensure_future(q.compact())
    await asyncio.sleep(0)  # one loop turn: compact() pauses the queue at its first step
    assert q._paused is not None  # the compaction thread runs; the queue is paused

    async def seen_after_compaction(call):
        result = await call
        assert q._store.generation == generation + 1, "a call ran before the compaction ended"
        return result

    put_ranges, got, settled, stats, extended = await asyncio.gather(
        seen_after_compaction(put(q, ["during"])),
        seen_after_compaction(q.get_batch(3, 1.0)),
        seen_after_compaction(q.settle(leased, encode_settle(5, {}, set(), results))),
        seen_after_compaction(q.stats()),
        seen_after_compaction(q.extend([leased])),
    )
    await compaction
    cursor, blob, _, dead = await seen_after_compaction(waiting_outcome)
    assert put_ranges == [(n, 1)]
    assert got is not None
    assert settled == (5, 0, 0, 0)
    assert stats.ready + stats.leased == n - 10 + 1 - 5 and stats.leased == 3
    assert extended == [leased]  # settled before the extend ran: that lease is gone
    (record,) = pickle.loads(blob)
    assert cursor == 11 and record[1] == [(seq, 1) for seq in range(10, 15)] and record[3] == results
    assert dead == []
    await q.close()

    q = open_queue(tmp_path)  # the leased 3 come back (rule 6), with everything else
    end, blob = await q.fetch_results(0)
    assert end == 11 and pickle.loads(blob)[-1] == record
    assert len(await drain(q)) == n - 10 - 5 + 1


async def test_close_waits_for_a_running_compaction(tmp_path):
    q = open_queue(tmp_path)
    # 5,000 chunks are enough: close() is called while the compaction is running (asserted),
    # with no await in between, however short the compaction.
    await build(q, n_chunks=5_000, n_results=0)
    compaction = asyncio.ensure_future(q.compact())
    await asyncio.sleep(0)  # one loop turn: compact() pauses the queue at its first step
    assert q._paused is not None
    await q.close()
    assert compaction.done() and compaction.exception() is None
    q = open_queue(tmp_path)
    assert (await q.stats()).ready == 5_000
    assert q._store.generation == 2



def test_on_a_cluster_a_compacting_queue_does_not_stall_its_neighbour(client, tmp_path):
    """Two durable queues on one worker: while one compacts a large index, the other answers."""
    from daskqueue.queue.durable import DurableQueue

    worker = sorted(client.scheduler_info()["workers"])[0]

    def open_actor(index, **kw):
        return client.submit(DurableQueue, index, str(tmp_path / f"q{index}"), fsync="never", actor=True,
                             workers=[worker], pure=False, **kw).result()

    big = open_actor(0, compact_index_bytes=1 << 30)
    neighbour = open_actor(1)
    # 40,000 chunks: a compaction of ~0.3 s, dozens of neighbour calls (puts on a worker cost
    # more per chunk as its heap grows: more would only lengthen the test).
    blob = many_chunks_blob(5000)
    for _ in range(8):
        big.put_batch(blob).result()
    client.run(lambda: (gc.collect(), gc.freeze()), workers=[worker])  # see frozen_heap
    try:
        started = time.perf_counter()
        compaction = big.compact()
        latencies = []
        while not compaction.done():
            t = time.perf_counter()
            neighbour.stats().result()
            latencies.append(time.perf_counter() - t)
        compaction.result()
        compaction_s = time.perf_counter() - started
    finally:
        client.run(gc.unfreeze, workers=[worker])
        big.close().result()
        neighbour.close().result()
    assert compaction_s > 0.05 and len(latencies) >= 3, (compaction_s, latencies)
    # Inline, the compaction stalled the whole worker: one neighbour call took all of it.
    # Off the loop, the neighbour answers throughout; the median, not the maximum, because
    # one call on a loaded 2-core machine may still wait out a scheduling hiccup.
    assert statistics.median(latencies) < compaction_s / 5, (latencies, compaction_s)
