"""The parent takes a child's reply that is already in the pipe when its write of the
batch returns, before the callbacks ready on the loop meanwhile (issue 24, lat3: a woken
child often runs on the writer's core, inside the write, and replies there)."""

from __future__ import annotations

import asyncio
import pickle
import time
from typing import Any

import cloudpickle
import pytest

from daskqueue import TransientQueue
from daskqueue.consumer.isolate import ProcessRunner
from tests.latw_consumers import EchoConsumer
from tests.test_latw_child import batch_of, run


class _SlowWriteRunner(ProcessRunner):
    """A runner whose write of a run frame returns only after the child had time to
    answer, with a loop callback made ready meanwhile (as the prefetch and the put's
    answer are on a worker)."""

    ready_ran: list[str] = []

    @staticmethod
    async def _send(child: Any, obj: Any) -> None:
        await ProcessRunner._send(child, obj)
        if obj[0] == "run":
            time.sleep(0.5)  # the loop is busy: the child's reply waits in the pipe
            asyncio.get_running_loop().call_soon(_SlowWriteRunner.ready_ran.append, "other callback")


@pytest.mark.timeout(60)
def test_a_reply_in_the_pipe_when_the_write_returns_is_taken_before_other_ready_callbacks():
    async def body(queue: TransientQueue) -> None:
        spec = cloudpickle.dumps((EchoConsumer, (0, [None]), {"isolation": "thread", "max_concurrency": 1}))
        runner = _SlowWriteRunner(spec, 0)
        try:
            await runner.start()
            _SlowWriteRunner.ready_ran.clear()
            done, errors, _, blob, _ = await runner.run(await batch_of(queue, ["a"]), {})
            assert (done, errors) == (1, {}) and pickle.loads(blob)[0][0] == "a"
            assert _SlowWriteRunner.ready_ran == []  # the run came back before it
            await asyncio.sleep(0)
            assert _SlowWriteRunner.ready_ran == ["other callback"]
            # A second batch on the same child: nothing was left behind in the pipe.
            done, _, _, blob, _ = await runner.run(await batch_of(queue, ["b", "c"]), {})
            assert done == 2 and [r[0] for r in pickle.loads(blob)] == ["b", "c"]
        finally:
            await runner.close()

    run(body)


@pytest.mark.timeout(90)
def test_a_child_that_died_before_the_write_returned_fails_the_batch_as_a_death():
    """The read right after the write may find the end of the child's output: the death
    is handled as the loop's reader would (the item that killed it fails, a new child runs
    the rest)."""
    async def body(queue: TransientQueue) -> None:
        spec = cloudpickle.dumps((EchoConsumer, (0, [None]), {"isolation": "thread", "max_concurrency": 1}))
        runner = _SlowWriteRunner(spec, 0)
        try:
            await runner.start()
            done, errors, _, blob, _ = await runner.run(await batch_of(queue, ["die", "x"]), {})
            assert done == 2 and set(errors) == {0}
            assert runner.deaths >= 1
            assert pickle.loads(blob)[1][0] == "x"
        finally:
            await runner.close()

    run(body)
