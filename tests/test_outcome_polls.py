"""The client's outcome polls: no lock held across a long poll (a send with claims never
waits behind one), a small send starts the poll its ``result`` waits on, and overlapping
fetches never file an outcome twice."""

from __future__ import annotations

import pickle
import threading

import pytest

from daskqueue.messages import make_id
from daskqueue.results import MapClaim, ResultCollector
from daskqueue.serialize import ResultRecord
from tests import tasks
from tests.helpers import wait_until


def _record(first, values):
    return ResultRecord(0, [(first, len(values))], [], pickle.dumps(values), None)


class Answer:
    """A call in flight whose answer the test gives (``done`` once it has one)."""

    def __init__(self, args):
        self.args = args
        self.value = None
        self.future = self

    def done(self):
        return self.value is not None


class ScriptedQueue:
    """One queue whose ``fetch_outcomes`` answers are given by the test, in any order: a
    non-waiting fetch is answered from ``now`` at once; a long poll when the test says."""

    def __init__(self):
        self.sent = []
        self.now = []

    def call(self, q, method, *args):
        self.sent.append(args)
        pending = Answer(args)
        if args[2] == 0:
            pending.value = self.now.pop(0)
        return pending

    def answer(self, q, pending, deadline=None):
        assert pending.done(), "waited for an answer the test never gives"
        return pending.value


def outcome(cursor, records):
    return (cursor, pickle.dumps(records), 0, [])


def test_overlapping_fetches_file_each_outcome_once_and_keep_what_the_queue_still_holds():
    queue = ScriptedQueue()
    c = ResultCollector(1, queue.call, queue.answer)
    c.prime([0])  # a long poll in flight, sent with cursors (0, 0)
    assert queue.sent == [(0, 0, pytest.approx(1.0))]
    long_poll = c._long[0].pending
    # A non-waiting poll meanwhile: it brings records 0..1 and moves the cursor to 2.
    queue.now.append(outcome(2, [_record(0, ["a", "b"])]))
    assert c.poll() == 2 and queue.sent[-1][:2] == (0, 0)
    assert sorted(v for _, v in c.take()) == ["a", "b"]
    # The long poll answers late, under the old cursors, with records 0..2: dropped (a and b
    # were taken, they must not come back); the next fetch reads c, which the queue still
    # holds (it was told only "everything before 2 is here").
    long_poll.value = outcome(3, [_record(0, ["a", "b"]), _record(2, ["c"])])
    queue.now.append(outcome(3, [_record(2, ["c"])]))
    assert c.poll() == 1 and queue.sent[-1][:2] == (2, 0)
    assert c.results == {make_id(0, 2): "c"} and not c._long


def test_a_held_queue_keeps_outcomes_aside_until_the_claims_are_registered():
    queue = ScriptedQueue()
    c = ResultCollector(1, queue.call, queue.answer)
    claim = MapClaim(2)
    with c.holding([0]):
        # The outcome of the send arrives before its put's answer was read.
        queue.now.append(outcome(2, [_record(0, [10, 11])]))
        assert c.poll() == 0 and c.results == {}
        c.claim(0, 0, 2, claim, 0)
    assert claim.complete and claim.values == [10, 11] and c.results == {}


@pytest.mark.timeout(120)
def test_a_map_completes_while_another_thread_long_polls(pools):
    """Issue 23: the collector's lock was held across a ``fetch_outcomes`` long poll, and a
    send with claims (``map``) took it to register them: the map waited for the poll."""
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    assert qp.map(tasks.double, [1]) == [2]  # warm
    polling = threading.Event()
    call = qp.collector._call

    def noting_call(q, method, *args):
        if method == "fetch_outcomes" and args[2] >= 20:
            polling.set()
        return call(q, method, *args)

    qp.collector._call = noting_call
    poller = threading.Thread(target=lambda: qp.poll_outcomes(wait_s=40), daemon=True)
    poller.start()
    wait_until(polling.is_set, timeout_s=30)
    out: list = []
    mapper = threading.Thread(target=lambda: out.append(qp.map(tasks.double, range(20))), daemon=True)
    mapper.start()
    mapper.join(timeout=25)  # far less than the poll's 40 s
    assert not mapper.is_alive(), "map waited behind another thread's long poll"
    assert out == [[2 * i for i in range(20)]]
    poller.join(timeout=60)


@pytest.mark.timeout(120)
def test_submit_starts_the_poll_that_result_waits_on(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    assert qp.result(qp.submit(tasks.double, 1), timeout_s=30) == 2  # warm
    sent: list = []
    call = qp.collector._call

    def noting_call(q, method, *args):
        sent.append(method)
        return call(q, method, *args)

    qp.collector._call = noting_call
    task_id = qp.submit(tasks.double, 21)
    assert sent == ["fetch_outcomes"]  # already on its way when submit returns
    assert qp.result(task_id, timeout_s=30) == 42
