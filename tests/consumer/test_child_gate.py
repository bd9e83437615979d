"""Batches sent to a consumer's child process ahead of a free run thread wait there at its
gate (``daskqueue.consumer.start_gate``): they start when a thread frees, never beside the
batches running, and come back unrun when taken back or past their latest start. Driven by
hand off any cluster, as in tests/test_latw_child.py."""

from __future__ import annotations

import asyncio
import time

import cloudpickle
import pytest

from daskqueue import TransientQueue
from daskqueue.consumer.isolate import ProcessRunner
from daskqueue.consumer.start_gate import NotStarted
from tests.gate_tasks import LoggingConsumer, lines
from tests.helpers import wait_until_async
from tests.test_latw_child import batch_of, run


def runner_of(max_concurrency: int = 1) -> ProcessRunner:
    spec = cloudpickle.dumps((LoggingConsumer, (0, [None]), {"isolation": "thread", "max_concurrency": max_concurrency}))
    return ProcessRunner(spec, 0)


@pytest.mark.timeout(60)
def test_a_batch_sent_while_every_child_thread_runs_starts_when_one_frees_not_beside_it(tmp_path):
    log = str(tmp_path / "log")

    async def body(queue: TransientQueue) -> None:
        runner = runner_of(max_concurrency=1)
        try:
            await runner.start()
            first = asyncio.ensure_future(runner.run(await batch_of(queue, [("a", log, 0.3)]), {}))
            second = asyncio.ensure_future(runner.run(await batch_of(queue, [("b", log, 0.0)]), {}))
            await asyncio.wait_for(asyncio.gather(first, second), 30)
        finally:
            await runner.close()

    run(body)
    # One run thread: the second batch waited for it in the child (it did not run beside
    # the first on the child's spare thread, which is there to read the pipe).
    assert lines(log) == ["start:a", "end:a", "start:b", "end:b"]


@pytest.mark.timeout(60)
def test_a_batch_past_its_latest_start_comes_back_unrun(tmp_path):
    log = str(tmp_path / "log")

    async def body(queue: TransientQueue) -> None:
        runner = runner_of(max_concurrency=1)
        try:
            await runner.start()
            with pytest.raises(NotStarted) as already:  # late on arrival
                await runner.run(await batch_of(queue, [("past", log, 0.0)]), {}, time.time() - 1)
            assert already.value.late
            first = asyncio.ensure_future(runner.run(await batch_of(queue, [("a", log, 0.5)]), {}))
            await wait_until_async(lambda: "start:a" in lines(log), timeout_s=30)
            # Waits for the thread, which frees after its latest start: it never starts.
            late = asyncio.ensure_future(runner.run(await batch_of(queue, [("late", log, 0.0)]), {}, time.time() + 0.1))
            in_time = asyncio.ensure_future(runner.run(await batch_of(queue, [("in_time", log, 0.0)]), {}, time.time() + 60))
            done, *_ = await asyncio.wait_for(first, 30)
            assert done == 1
            with pytest.raises(NotStarted) as waited:
                await asyncio.wait_for(late, 30)
            assert waited.value.late
            assert (await asyncio.wait_for(in_time, 30))[0] == 1
        finally:
            await runner.close()

    run(body)
    assert lines(log) == ["start:a", "end:a", "start:in_time", "end:in_time"]


@pytest.mark.timeout(60)
def test_take_back_returns_the_waiting_batches_unrun_and_lets_the_running_one_end(tmp_path):
    log = str(tmp_path / "log")

    async def body(queue: TransientQueue) -> None:
        runner = runner_of(max_concurrency=1)
        try:
            await runner.start()
            running = asyncio.ensure_future(runner.run(await batch_of(queue, [("a", log, 0.5)]), {}))
            await wait_until_async(lambda: "start:a" in lines(log), timeout_s=30)
            waiting = [asyncio.ensure_future(runner.run(await batch_of(queue, [(n, log, 0.0)]), {}))
                       for n in ("b", "c")]
            # Both written to the child's pipe before the take-back.
            await wait_until_async(lambda: len(runner._child.requests) == 3, timeout_s=30)  # noqa: SLF001
            runner.take_back()
            for w in waiting:
                with pytest.raises(NotStarted) as taken:
                    await asyncio.wait_for(w, 30)
                assert not taken.value.late
            assert (await asyncio.wait_for(running, 30))[0] == 1
            # The child still runs what it is sent next.
            assert (await asyncio.wait_for(runner.run(await batch_of(queue, [("d", log, 0.0)]), {}), 30))[0] == 1
        finally:
            await runner.close()

    run(body)
    assert lines(log) == ["start:a", "end:a", "start:d", "end:d"]
