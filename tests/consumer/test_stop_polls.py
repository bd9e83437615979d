"""A stopping consumer ends its long polls instead of waiting them out (``end_polls`` at the
queue, ``QueueCalls.end_waits`` at the consumer), and loses no lease doing so."""

from __future__ import annotations

import asyncio
import time

import pytest

from daskqueue.consumer.calls import QueueCalls
from daskqueue.queue.transient import TransientQueue
from tests.helpers import wait_until, wait_until_async
from tests.queue.test_handoff import _raw_blob

pytestmark = pytest.mark.timeout(60)

LONG_POLL_S = 60.0  # far longer than any wait below: a poll that ends did not time out


async def test_end_polls_answers_that_owners_waiting_polls_and_no_others():
    q = TransientQueue(0)
    try:
        stopping = asyncio.ensure_future(q.get_batch(10, LONG_POLL_S, "tcp://stopping:1"))
        running = asyncio.ensure_future(q.get_batch(10, LONG_POLL_S, "tcp://running:1"))
        await wait_until_async(lambda: _polls_started(q, 2), timeout_s=10)

        await q.end_polls("tcp://stopping:1")
        assert await asyncio.wait_for(stopping, 10) is None
        await asyncio.sleep(0)  # the other poll was woken too: it must go back to waiting
        assert not running.done()

        await q.put_batch(_raw_blob([1]))  # and it still gets the next message
        assert isinstance(await asyncio.wait_for(running, 10), bytes)
        assert (await q.stats()).leased == 1
    finally:
        await q.close()


async def test_end_waits_ends_a_consumers_poll_of_a_local_queue():
    q = TransientQueue(0)
    calls = QueueCalls({0: q})
    calls.bind()
    try:
        poll = asyncio.ensure_future(calls.call(0, "get_batch", 10, LONG_POLL_S, "tcp://me:1", wait_s=LONG_POLL_S))
        await wait_until_async(lambda: _polls_started(q, 1), timeout_s=10)
        await calls.end_waits("tcp://me:1")
        assert await asyncio.wait_for(poll, 10) is None
        assert (await q.stats()).leased == 0
    finally:
        await q.close()


@pytest.mark.timeout(120)
def test_closing_idle_consumers_does_not_wait_out_their_long_polls(pools):
    # One queue, two consumers on the two workers: one polls its queue on its own worker,
    # the other across workers (an actor call).
    qp = pools.queue(1)
    cp = pools.consumer(qp, idle_poll_s=LONG_POLL_S)
    cp.start()
    # Each consumer asks once without waiting, then long-polls: four calls, two waiting.
    wait_until(lambda: qp.stats()[0].get_calls >= 4, timeout_s=60)

    started = time.monotonic()
    cp.close()
    # Not waited out (nor given up after close's own STOP_TIMEOUT_S, 25 s): the polls were ended.
    assert time.monotonic() - started < 10
    assert qp.stats()[0].leased == 0


async def _polls_started(q: TransientQueue, n: int) -> bool:
    """Whether ``n`` calls reached ``q``'s ``get_batch``: in-process, a poll that found nothing
    goes on to wait with no await in between."""
    return (await q.stats()).get_calls == n
