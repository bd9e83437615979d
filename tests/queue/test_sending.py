"""A submission that fails part-way: every answer is collected, the ids of what was stored
are known, and a lost queue's error counts exactly the messages lost."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from daskqueue.errors import QueueClosedError, QueueLostError
from daskqueue.messages import Kind, split_id
from daskqueue.queue.encode import PutOptions, encode_payloads
from daskqueue.queue.router import Router
from daskqueue.queue.sending import Sender
from daskqueue.queue.table import QueueTable
from daskqueue.results import ResultCollector


def test_a_put_refused_by_one_queue_still_returns_the_ids_the_others_stored(pools):
    qp = pools.queue(2, put_batch_size=10)
    qp.queues[1].close().result(timeout=30)  # queue 1 refuses every put from now on
    with pytest.raises(QueueClosedError) as info:
        qp.put_many(range(40))  # batches to queues 0, 1, 0, 1
    stored = [i for i in info.value.stored_ids if i is not None]
    assert len(stored) == 20 and {split_id(i)[0] for i in stored} == {0}
    assert qp.queues[0].stats().result(timeout=30).pending == 20  # exactly those, no more


class FakeQueue:
    """Answers ``put_batch`` at once: ids from 0 on, or ``error``."""

    def __init__(self, address, error=None):
        self._address = address
        self.error = error
        self.next_seq = 0

    def put_batch(self, blob, token):
        f = Future()
        if self.error is not None:
            f.set_exception(self.error)
        else:
            f.set_result([(self.next_seq, 10)])
            self.next_seq += 10
        return f


def test_a_lost_queue_counts_the_messages_of_every_failed_put_and_the_earlier_ones():
    lost = QueueLostError(1, "tcp://w1", "transient")
    handles = [FakeQueue("tcp://w0"), FakeQueue("tcp://w1", lost)]
    table = QueueTable("transient", handles, [None, None], scheduler_lost=lambda: None, settled=lambda q: 3)
    table.put_counts[1] = 5  # put earlier, 3 outcomes back: 2 of them lost
    sender = Sender(table, Router(range(2), typed=False), ResultCollector(2, None, None))
    batches = encode_payloads(list(range(40)), None, kind=Kind.RAW, function=None, options=PutOptions(),
                              size=10, limit=2**20, what="item")
    with pytest.raises(QueueLostError) as info:
        sender.send(batches, n=40)
    assert info.value.lost_messages == 2 + 20  # the earlier ones, and both puts of this call
    stored = info.value.stored_ids
    assert [p for p, i in enumerate(stored) if i is not None] == list(range(10)) + list(range(20, 30))
    assert [split_id(stored[p]) for p in (0, 29)] == [(0, 0), (0, 19)]
    assert table.put_counts == [20, 5]
