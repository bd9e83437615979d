"""Where a stream's client waited with outcomes it could already use (branch ``stream5``,
benchmarks/README.md, issue 24): a long poll of every queue that waits for each queue in
turn while another's outcomes are filed, and an ``imap`` wait that long-polls while its
chunk's send holds the outcomes it fetched (they are filed only as that send ends). Without
a cluster: scripted queues and a scripted stream."""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from daskqueue.messages import make_id
from daskqueue.queue import streaming
from daskqueue.queue.stream_parts import Sends
from daskqueue.queue.streaming import StreamClaim, Streaming, _Stream
from daskqueue.results import ResultCollector
from daskqueue.serialize import ResultRecord


class Answer:
    """A call in flight whose answer the test gives (``done`` once it has one)."""

    def __init__(self, args):
        self.args = args
        self.value = None
        self.future = self

    def done(self):
        return self.value is not None


def answered(cursor, q, first, values):
    return (cursor, pickle.dumps([ResultRecord(q, [(first, len(values))], [], pickle.dumps(values), None)]), 0, [])


@pytest.mark.timeout(10)
def test_a_streams_long_poll_of_every_queue_returns_with_the_first_queues_outcomes_not_after_the_next():
    sent: dict[int, list[Answer]] = {0: [], 1: []}

    def call(q, method, *args):
        pending = Answer(args)
        if q == 0:  # queue 0 has outcomes: its long poll is answered at once
            pending.value = answered(2, 0, 0, ["a", "b"])
        sent[q].append(pending)
        return pending

    def answer(q, pending, deadline=None):
        assert pending.done(), f"waited on queue {q}'s long poll while queue 0's outcomes were filed"
        return pending.value

    c = ResultCollector(2, call, answer)
    assert c.poll(wait_s=0.05, first=True) == 2
    assert c.results == {make_id(0, 0): "a", make_id(0, 1): "b"}
    # Queue 1's long poll stays in flight: the next poll reads its answer, sends no other.
    assert c._long[1].pending is sent[1][0]
    sent[1][0].value = answered(1, 1, 0, ["c"])
    assert c.poll(wait_s=0.05, first=True) == 1 and len(sent[1]) == 1
    assert c.results[make_id(1, 0)] == "c"


class ScriptedPool:
    """What ``Streaming._wait`` uses of a pool: ``outcomes.poll`` (each poll notes whether a
    chunk's send was under way when it was made), ``collector.holds_all`` (the send holds
    every queue) and the consumer checks."""

    def __init__(self, sends, first_poll_done):
        self.sends = sends
        self.first_poll_done = first_poll_done
        self.polls: list[bool] = []
        self.outcomes = self
        self.collector = self

    def holds_all(self):
        return True

    def poll(self, *, wait_s=0.0, deadline=None, queue_index=None, first=False):
        self.polls.append(self.sends.under_way())
        self.first_poll_done.set()
        return 0  # what it fetched is held by the send under way (or nothing came)

    def check_scheduler(self):
        pass

    def has_running_consumers(self):
        return True


@pytest.mark.timeout(20)
def test_an_imap_wait_waits_for_the_send_that_holds_its_outcomes_instead_of_polling_again(monkeypatch):
    # A slice far longer than the send: a wait that polls again does so while it is under way.
    monkeypatch.setattr(streaming, "_WAIT_SLICE_S", 5.0)
    claim = StreamClaim(4)
    sends = Sends()
    first_poll_done = threading.Event()

    def put():  # the chunk's send: it ends (filing what its hold kept aside) after the first poll
        assert first_poll_done.wait(10)
        time.sleep(0.05)
        claim.succeed(0, [1, 2, 3, 4])

    try:
        sends.submit(claim, put)
        stream = _Stream(iter(()), 8, 4, None, "raise", True, lambda items, offset: claim, lambda c: None,
                         chunks=[claim], put=4, exhausted=True)
        pool = ScriptedPool(sends, first_poll_done)
        Streaming._wait(pool, stream, sends)  # type: ignore[arg-type]
        assert stream.has_ready()
        assert pool.polls == [True], "polled again while the send holding the outcomes was under way"
    finally:
        sends.stop()


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.timeout(10)
def test_a_stream_refills_its_window_as_each_chunk_ends_not_after_every_arrived_chunk_is_yielded(ordered):
    sent = []

    def send(items, offset):
        sent.append(offset)
        return StreamClaim(len(items))

    s = _Stream(iter(range(100)), 8, 2, None, "raise", ordered, send, lambda c: None)
    s.fill()
    assert sent == [0, 2, 4, 6]
    for c in s.chunks:  # every outcome of the window arrived
        c.succeed(0, [1] * c.n)
    # One chunk's outcomes, then the caller fills the window (the next chunk is put) before
    # it asks for the next: yielding all four first let the queues run dry meanwhile.
    assert len(list(s.ready())) == 1
    s.fill()
    assert sent == [0, 2, 4, 6, 8]
