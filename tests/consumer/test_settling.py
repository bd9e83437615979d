"""A consumer's runs, settlements and leases, driven in this process without a cluster.

Real ``TransientQueue`` objects, wrapped where a test needs a queue that is slow, that
fails, or that looks remote (a handle with an ``_address`` is called with a deadline).
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest

from daskqueue.consumer import calls as calls_module
from daskqueue.consumer.base import ConsumerBase
from daskqueue.consumer.calls import QueueCalls
from daskqueue.consumer.counters import Counters
from daskqueue.consumer.settling import Settler
from daskqueue.messages import Kind
from daskqueue.queue.transient import TransientQueue
from daskqueue.serialize import Group, decode_delivery, decode_settle, encode_put, encode_settle, pack_payloads
from tests.helpers import wait_until_async
from tests.segment.helpers import put

pytestmark = pytest.mark.timeout(60)


class Echo(ConsumerBase):
    def process_item(self, message):
        return message.data


def consumer(cls, queue, **kw):
    kw.setdefault("isolation", "thread")
    kw.setdefault("idle_poll_s", 0.05)
    return cls(0, [queue], **kw)


class Wrapped:
    """The queue object behind a wrapper whose methods a test overrides."""

    def __init__(self, queue: TransientQueue) -> None:
        self.queue = queue

    def __getattr__(self, name):
        return getattr(self.queue, name)


async def ready_attempts(q: TransientQueue) -> list[int] | None:
    """The attempts of the messages ready now (taken and given back), or None if none is."""
    blob = await q.get_batch(100, 0.0)
    if blob is None:
        return None
    lease_id, _, segments = decode_delivery(blob)
    await q.settle(lease_id, _released())
    return [s.attempts for s in segments for _ in range(s.count)]


def _released() -> bytes:
    return encode_settle(0, {}, set(), None)


# -- results are pickled off the event loop -------------------------------------------------------


class PickledOn:
    """A result that notes the thread pickling it."""

    threads: list[int] = []

    def __reduce__(self):
        PickledOn.threads.append(threading.get_ident())
        return (str, ("pickled",))


class ReturnsPickledOn(ConsumerBase):
    def process_item(self, message):
        return PickledOn()


async def test_results_are_pickled_on_the_run_thread_not_on_the_event_loop():
    PickledOn.threads.clear()
    q = TransientQueue(0)
    await put(q, ["a", "b", "c"])
    c = consumer(ReturnsPickledOn, q)
    await c.start()
    try:
        await wait_until_async(lambda: c._counters.items_done == 3, timeout_s=20)
    finally:
        await c.close()
        await q.close()
    assert PickledOn.threads and threading.get_ident() not in PickledOn.threads


# -- lease extension ------------------------------------------------------------------------------


class NeverAnswers:
    _address = "tcp://10.255.0.1:1"

    async def extend(self, lease_ids):
        await asyncio.Event().wait()


class CountsExtends:
    _address = "tcp://10.255.0.2:1"

    def __init__(self) -> None:
        self.at: list[float] = []

    async def extend(self, lease_ids):
        self.at.append(time.monotonic())
        return []


async def test_a_queue_that_never_answers_delays_no_other_queues_lease_extension():
    lease_timeout_s = 0.6
    stuck, healthy = NeverAnswers(), CountsExtends()
    queue_calls = QueueCalls({0: stuck, 1: healthy})
    queue_calls.bind()
    settler = Settler(0, queue_calls, Counters(), lease_timeout_s=lease_timeout_s, held=lambda: [(0, 7), (1, 8)])
    extending = asyncio.get_running_loop().create_task(settler.extend_forever())
    try:
        await wait_until_async(lambda: len(healthy.at) >= 4, timeout_s=10)
    finally:
        extending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await extending
    gaps = [b - a for a, b in zip(healthy.at, healthy.at[1:])]
    assert max(gaps) < lease_timeout_s, gaps


# -- a fetch that never started its batch gives its lease back, no attempt counted -----------------


class AnswersLate(Wrapped):
    """A queue on another worker whose get_batch answers after the caller's deadline. As
    with a real remote call, the caller giving up does not stop the call at the queue."""

    _address = "tcp://10.255.0.3:1"

    def __init__(self, queue: TransientQueue, delay_s: float) -> None:
        super().__init__(queue)
        self.delay_s = delay_s
        self.remote_calls: list[asyncio.Task] = []

    async def get_batch(self, *args):
        call = asyncio.get_running_loop().create_task(self._at_the_queue(args))
        self.remote_calls.append(call)
        return await asyncio.shield(call)

    async def _at_the_queue(self, args):
        await asyncio.sleep(self.delay_s)
        return await self.queue.get_batch(*args)


async def test_a_lease_that_arrives_after_the_fetch_gave_up_is_given_back_without_an_attempt(monkeypatch):
    monkeypatch.setattr(calls_module, "REMOTE_CALL_TIMEOUT_S", 0.1)
    q = TransientQueue(0, lease_timeout_s=60.0)
    await put(q, ["late"])
    late = AnswersLate(q, delay_s=0.5)
    c = consumer(Echo, late)
    await c.start()
    seen: list[list[int] | None] = []

    async def ready_again() -> bool:
        seen.append(await ready_attempts(q))
        return seen[-1] is not None

    try:
        # The fetch gave up after 0.1 s; the queue leased the message at 0.5 s, and only a
        # give-back (not the 60 s lease expiry) makes it ready again.
        await wait_until_async(lambda: late.remote_calls and all(t.done() for t in late.remote_calls),
                               timeout_s=10)
        await wait_until_async(ready_again, timeout_s=10)
    finally:
        await c.close()
        await asyncio.gather(*late.remote_calls)
    assert seen[-1] == [0] and c._counters.items_done == 0
    await q.close()


class FunctionsFail(Wrapped):
    """A queue whose get_functions fails: a fetched batch of tasks cannot start."""

    def __init__(self, queue: TransientQueue) -> None:
        super().__init__(queue)
        self.settled: list[tuple[int, dict]] = []

    async def get_functions(self, digests):
        raise OSError("functions unavailable")

    async def settle(self, lease_id, blob):
        done, errors, *_ = decode_settle(blob)
        self.settled.append((done, errors))
        return await self.queue.settle(lease_id, blob)


def task_blob(n: int) -> bytes:
    digest = b"f" * 32
    offsets, data = pack_payloads([(i,) for i in range(n)], max_message_bytes=2**20)
    return encode_put([Group(Kind.CALL, digest, None, 0, None, 0.0, n, offsets, data)],
                      {digest: pickle.dumps(abs)})


async def test_a_batch_whose_functions_cannot_be_fetched_is_given_back_without_an_attempt():
    q = TransientQueue(0, lease_timeout_s=60.0)
    await q.put_batch(task_blob(3))
    wrapped = FunctionsFail(q)
    c = consumer(Echo, wrapped)
    await c.start()
    try:
        await wait_until_async(lambda: wrapped.settled, timeout_s=10)
    finally:
        await c.close()
    assert wrapped.settled[0] == (0, {})  # nothing ran, nothing failed
    assert await ready_attempts(q) == [0, 0, 0]
    await q.close()
