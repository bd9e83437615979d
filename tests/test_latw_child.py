"""A consumer's child process (``isolation="auto"``), driven by hand off any cluster: the
parent reads the child's output with a callback of its loop, and the child's run threads
take turns reading their input (issue 24: fewer hand-overs on one task's path)."""

from __future__ import annotations

import asyncio
import os
import pickle

import cloudpickle
import pytest

from daskqueue import TransientQueue
from daskqueue.consumer.batch import Batch
from daskqueue.consumer.isolate import ProcessRunner
from daskqueue.messages import Kind, decode_error
from daskqueue.serialize import Group, decode_delivery, encode_put, pack_payloads
from tests.latw_consumers import EchoConsumer


async def batch_of(queue: TransientQueue, items: list) -> Batch:
    offsets, data = pack_payloads(items, max_message_bytes=2**24)
    await queue.put_batch(encode_put([Group(Kind.RAW, None, None, 0, None, 0.0, len(items), offsets, data)], {}))
    lease_id, index, segments = decode_delivery(await queue.get_batch(len(items)))
    return Batch(0, index, lease_id, segments, sum(s.count for s in segments))


def runner_of(max_concurrency: int = 1) -> ProcessRunner:
    spec = cloudpickle.dumps((EchoConsumer, (0, [None]), {"isolation": "thread", "max_concurrency": max_concurrency}))
    return ProcessRunner(spec, 0)


def run(coro_fn) -> None:
    async def main() -> None:
        queue = TransientQueue(0)
        try:
            await coro_fn(queue)
        finally:
            await queue.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_results_of_small_big_and_concurrent_batches_come_back_whole():
    async def body(queue: TransientQueue) -> None:
        runner = runner_of(max_concurrency=2)
        try:
            done, errors, _, blob, _ = await runner.run(await batch_of(queue, ["a", "b"]), {})
            assert (done, errors) == (2, {})
            assert [r[0] for r in pickle.loads(blob)] == ["a", "b"]
            # Several reads of the pipe for one frame (a pipe holds 64 KiB).
            done, _, _, blob, _ = await runner.run(await batch_of(queue, [("big", 3 << 20)]), {})
            assert pickle.loads(blob) == [b"x" * (3 << 20)]
            batches = [await batch_of(queue, [("sleep", 0.05), k]) for k in range(6)]
            answers = await asyncio.gather(*(runner.run(b, {}) for b in batches))
            assert [pickle.loads(a[3])[1][0] for a in answers] == list(range(6))
        finally:
            await runner.close()

    run(body)


@pytest.mark.timeout(60)
def test_a_batch_runs_on_the_child_thread_that_read_it_and_halt_is_read_while_every_slot_runs():
    async def body(queue: TransientQueue) -> None:
        runner = runner_of(max_concurrency=1)
        try:
            _, _, _, blob, _ = await runner.run(await batch_of(queue, ["t"]), {})
            # One run slot: the reading thread runs it (no pool thread hands it over).
            assert pickle.loads(blob)[0][1].startswith(("MainThread", "daskqueue-child-"))
            long = asyncio.ensure_future(runner.run(await batch_of(queue, [("sleep", 0.2)] * 20), {}))
            await asyncio.sleep(0.5)
            await runner.set_halt(True)  # read by the other thread while the only slot runs
            done, *_ = await asyncio.wait_for(long, 10)
            assert 1 <= done < 20
        finally:
            await runner.close()

    run(body)


@pytest.mark.timeout(90)
def test_a_child_that_dies_fails_only_the_item_that_killed_it_and_is_replaced():
    async def body(queue: TransientQueue) -> None:
        runner = runner_of()
        try:
            done, errors, _, blob, _ = await runner.run(await batch_of(queue, ["a", "die", "c"]), {})
            assert done == 3 and set(errors) == {1}
            assert "died" in decode_error(errors[1])[1]
            assert runner.deaths >= 1
            _, _, _, blob, _ = await runner.run(await batch_of(queue, ["after"]), {})
            assert pickle.loads(blob)[0][0] == "after"
        finally:
            await runner.close()

    run(body)


@pytest.mark.timeout(60)
def test_close_ends_the_child_and_closes_its_pipe():
    async def body(queue: TransientQueue) -> None:
        runner = runner_of()
        await runner.start()
        fds_running = set(os.listdir("/proc/self/fd"))
        proc = runner._child.proc  # noqa: SLF001  (the test looks at the process it ends)
        await runner.close()
        assert proc.returncode is not None
        assert runner.deaths == 0  # an ordered close is not a death
        assert len(set(os.listdir("/proc/self/fd"))) < len(fds_running)

    run(body)
