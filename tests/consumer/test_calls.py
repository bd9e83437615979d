"""A consumer's calls to its queues: deadlines and the errors they raise (no cluster)."""

from __future__ import annotations

import asyncio

import pytest

from daskqueue.consumer.calls import QueueCalls
from daskqueue.errors import DaskQueueError, QueueCallTimeoutError

pytestmark = pytest.mark.timeout(60)


class NeverAnswersGet:
    """A queue on another worker (it has an address) that never answers."""

    _address = "tcp://10.255.0.4:1"

    async def get_batch(self, *args):
        await asyncio.Event().wait()


async def test_a_remote_call_past_its_deadline_raises_a_typed_timeout():
    queue_calls = QueueCalls({0: NeverAnswersGet()})
    queue_calls.bind()
    with pytest.raises(QueueCallTimeoutError) as caught:
        await queue_calls.call(0, "get_batch", 10, 0.0, None, deadline_s=0.05)
    assert isinstance(caught.value, DaskQueueError) and isinstance(caught.value, TimeoutError)
    assert (caught.value.queue_index, caught.value.method) == (0, "get_batch")


class Answers:
    """A queue in this process that answers ``stats``."""

    async def stats(self):
        return "stats"


@pytest.mark.parametrize("moving", [False, True])
async def test_a_call_to_a_queue_no_longer_among_the_consumers_raises_queue_lost_not_key_error(moving):
    from daskqueue.errors import QueueLostError

    queue_calls = QueueCalls({0: Answers()})
    queue_calls.bind()
    assert await queue_calls.call(0, "stats") == "stats"
    queue_calls.replace({})  # the pool removed queue 0 (remove_queue): it left this consumer's set
    call = queue_calls.call_moving if moving else queue_calls.call
    with pytest.raises(QueueLostError) as caught:
        await call(0, "stats")
    assert caught.value.queue_index == 0


async def test_record_outcomes_made_again_where_the_queue_moved_is_stored_once():
    import pickle

    from daskqueue.queue.transient import TransientQueue
    from daskqueue.serialize import decode_records

    old = TransientQueue(0)  # driven by hand, on this test's event loop
    moved: list[TransientQueue] = []

    class RecordsThenMoves:
        """The old queue on another worker: it stores the record, then hands itself off to
        a successor before its answer reaches the consumer (which never gets it)."""

        _address = "tcp://10.255.0.5:1"

        async def record_outcomes(self, *args):
            await old.record_outcomes(*args)
            successor = TransientQueue(0, handoff=await old.hand_off())
            moved.append(successor)
            queue_calls.move(0, successor)
            await asyncio.Event().wait()

    queue_calls = QueueCalls({0: RecordsThenMoves()})
    queue_calls.bind()
    await queue_calls.call_moving(0, "record_outcomes", [(0, 1)], {}, pickle.dumps(["r"]), 0, [0])
    successor = moved[0]
    _, blob, _, _ = await successor.fetch_outcomes(0, 0)
    assert [record.ranges for record in decode_records(blob)] == [[(0, 1)]]  # stored once, not twice
    await successor.close()


async def test_record_outcomes_tokens_do_not_push_put_tokens_out():
    """Review finding 10: early-acked batches' tokens shared the bounded put-token dict, so
    10,000 of them made a put retried after a lost answer look new (stored twice)."""
    import os
    import pickle

    from daskqueue.queue.base import TOKENS_KEPT
    from daskqueue.queue.transient import TransientQueue
    from daskqueue.serialize import Group, encode_put, pack_payloads

    queue = TransientQueue(0)
    offsets, data = pack_payloads([("x",)], max_message_bytes=1 << 20)
    blob = encode_put([Group(1, None, None, 0, None, 0.0, 1, offsets, data)], {})
    put_token = os.urandom(16)
    first = await queue.put_batch(blob, put_token)
    for k in range(TOKENS_KEPT + 10):
        await queue.record_outcomes([(0, 1)], {}, pickle.dumps(["r"]), 0, [0], os.urandom(16))
    assert await queue.put_batch(blob, put_token) == first  # recognised: not stored again
    assert (await queue.stats()).ready == 1
    await queue.close()
