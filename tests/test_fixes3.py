"""Client-side defects of an interrupted send, and of a lane write interrupted mid-frame
(the fakes stand in for queue actors only: no cluster needed)."""

from __future__ import annotations

import signal
import socket
import threading
from concurrent.futures import Future

import pytest

from daskqueue.errors import QueueClosedError
from daskqueue.messages import Kind
from daskqueue.queue.encode import PutOptions, encode_payloads
from daskqueue.queue.router import Router
from daskqueue.queue.sending import Sender
from daskqueue.queue.table import QueueTable
from daskqueue.results import MapClaim, ResultCollector


class FakeQueue:
    """A queue actor's put_batch: ``on_put(queue, future)`` answers each put."""

    def __init__(self, address, on_put=None):
        self._address = address
        self.on_put = on_put or FakeQueue.store
        self.seq = 0
        self.calls = 0
        self.tokens = {}

    def put_batch(self, blob, token):
        self.calls += 1
        f = Future()
        if token in self.tokens:  # the same put again: its ids, nothing stored
            f.set_result(self.tokens[token])
        else:
            self.on_put(self, f, token)
        return f

    def store(self, f, token):
        self.tokens[token] = [(self.seq, 10)]
        f.set_result(self.tokens[token])
        self.seq += 10


def table_of(handles):
    return QueueTable("transient", handles, [None] * len(handles), scheduler_lost=lambda: None,
                      settled=lambda q: 0)


def batches_of(n, kind=Kind.RAW):
    return encode_payloads(list(range(n)), None, kind=kind, function=None, options=PutOptions(),
                           size=10, limit=2**20, what="item")


@pytest.mark.timeout(30)
def test_an_interrupted_send_reports_a_put_rerouted_from_a_removed_queue_as_stored(monkeypatch):
    # Queue 1 refuses its put (closed once drained by remove_queue); the put goes to queue 0
    # under a new token, which stores it, but the caller is interrupted while waiting. The
    # answers read after the interruption must be the live put's, not the refused one's.
    router = Router(range(2), typed=False)

    def q1_put(s, f, token):
        router.route_to([0])  # remove_queue(1) meanwhile
        f.set_exception(QueueClosedError("closed once drained"))

    handles = [FakeQueue("tcp://w0"), FakeQueue("tcp://w1", q1_put)]
    table = table_of(handles)
    answer = table.answer
    interrupted = []

    def answer_or_interrupt(q, pending, deadline=None):
        if q == 0 and handles[0].calls == 2 and not interrupted:  # waiting for the rerouted put
            interrupted.append(True)
            raise KeyboardInterrupt
        return answer(q, pending, deadline)

    monkeypatch.setattr(table, "answer", answer_or_interrupt)
    sender = Sender(table, router, ResultCollector(2, None, None))
    with pytest.raises(KeyboardInterrupt) as info:
        sender.send(batches_of(20), n=20)
    stored_ids = info.value.stored_ids
    assert handles[0].seq == 20 and handles[1].seq == 0
    assert all(i is not None for i in stored_ids)
    assert table.put_counts[0] == 20


@pytest.mark.timeout(30)
def test_a_put_sent_but_not_yet_noted_when_interrupted_is_read_after_all(monkeypatch):
    # Ctrl-C right after a put went out (before the send noted it): its answer is still read.
    handles = [FakeQueue("tcp://w0"), FakeQueue("tcp://w1")]
    table = table_of(handles)
    call = table.call
    n = [0]

    def call_then_interrupt(q, method, *args):
        pending = call(q, method, *args)
        n[0] += 1
        if n[0] == 2:
            raise KeyboardInterrupt
        return pending

    monkeypatch.setattr(table, "call", call_then_interrupt)
    sender = Sender(table, Router(range(2), typed=False), ResultCollector(2, None, None))
    with pytest.raises(KeyboardInterrupt) as info:
        sender.send(batches_of(20), n=20)
    assert [h.seq for h in handles] == [10, 10]
    assert all(i is not None for i in info.value.stored_ids)
    assert table.put_counts == [10, 10]


@pytest.mark.timeout(30)
def test_a_lane_write_interrupted_mid_frame_breaks_the_connection():
    # Ctrl-C while a large request is being written leaves part of a frame on the stream:
    # the connection must count as broken, so no later request follows it there.
    from daskqueue.queue.lane_connection import LaneBroken, LaneConnection

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    accepted = []
    threading.Thread(target=lambda: accepted.append(srv.accept()), daemon=True).start()
    conn = LaneConnection("127.0.0.1", srv.getsockname()[1], b"x" * 32, loss_timeout_s=30)

    def interrupt(_signum, frame):
        # Ctrl-C during the write, not before it: on a loaded machine a fixed alarm could
        # come while the 32 MiB frame was still being encoded, before any of it was written
        # (the connection then rightly serves on, and the test failed for nothing). Until
        # the write is under way (it blocks: nobody reads the other end), try again shortly.
        while frame is not None and frame.f_code is not LaneConnection._send_all.__code__:
            frame = frame.f_back
        if frame is None:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(KeyboardInterrupt):
            conn.send("put_batch", (b"\0" * (32 << 20), b"t" * 16))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    try:
        assert conn.broken is not None
        with pytest.raises(LaneBroken):
            conn.send("fetch_outcomes", (0, 0, 0.0))
    finally:
        conn.close()
        srv.close()


@pytest.mark.timeout(60)
def test_after_an_interruption_the_puts_answers_are_awaited_within_one_shared_deadline(monkeypatch, caplog):
    # Ctrl-C with three queues that never answer: the answers are awaited within one
    # deadline for them all, not a call timeout each; the put answered is still read.
    import time

    from daskqueue import defaults
    from daskqueue.queue import sending

    monkeypatch.setattr(defaults, "CALL_TIMEOUT_S", 5.0)
    monkeypatch.setattr(sending, "INTERRUPTED_READ_S", 0.5)

    def silent(s, f, token):
        pass  # never answers

    handles = [FakeQueue("tcp://w0")] + [FakeQueue(f"tcp://w{i}", silent) for i in (1, 2, 3)]
    table = table_of(handles)
    answer = table.answer
    interrupted = []

    def answer_or_interrupt(q, pending, deadline=None):
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return answer(q, pending, deadline)

    monkeypatch.setattr(table, "answer", answer_or_interrupt)
    sender = Sender(table, Router(range(4), typed=False), ResultCollector(4, None, None))
    caplog.set_level("INFO", logger="daskqueue")
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        sender.send(batches_of(40), n=40)
    took = time.monotonic() - started
    stored_ids = info.value.stored_ids
    assert all(i is not None for i in stored_ids[:10]) and all(i is None for i in stored_ids[10:])
    assert table.put_counts == [10, 0, 0, 0]
    assert took < 2 * defaults.CALL_TIMEOUT_S  # one call timeout each would be three
    assert "reading 4 sent puts' answers (Ctrl-C again to stop)" in caplog.text


@pytest.mark.timeout(30)
def test_a_put_whose_recording_was_interrupted_is_counted_and_claimed_once(monkeypatch):
    # Ctrl-C lands while a put's claim is registered: the put is read again after the
    # interruption, and must be counted (and claimed) once, not twice.
    handles = [FakeQueue("tcp://w0"), FakeQueue("tcp://w1")]
    table = table_of(handles)
    collector = ResultCollector(2, None, None)
    claim = collector.claim
    calls = []

    def claim_or_interrupt(*args):
        calls.append(args)
        if len(calls) == 1:
            claim(*args)  # registered, then interrupted before the put is recorded
            raise KeyboardInterrupt
        return claim(*args)

    monkeypatch.setattr(collector, "claim", claim_or_interrupt)
    sender = Sender(table, Router(range(2), typed=False), collector)
    with pytest.raises(KeyboardInterrupt) as info:
        sender.send(batches_of(20, Kind.CALL), n=20, claim=MapClaim(20))
    assert sum(i is not None for i in info.value.stored_ids) == 20
    assert table.put_counts == [10, 10]
    assert [len(collector._claim_starts[q]) for q in (0, 1)] == [1, 1]


@pytest.mark.timeout(30)
def test_an_interruption_as_queues_are_held_does_not_hold_them_for_good():
    # Ctrl-C just as holding() took its holds (as its lock is let go): the holds go too,
    # else the queues' outcomes would be kept aside forever.
    collector = ResultCollector(2, None, None)
    lock = collector._lock

    class InterruptedOnce:
        fired = False

        def __enter__(self):
            return lock.__enter__()

        def __exit__(self, *exc):
            lock.__exit__(*exc)
            if not InterruptedOnce.fired:
                InterruptedOnce.fired = True
                raise KeyboardInterrupt
            return False

    collector._lock = InterruptedOnce()
    try:
        with pytest.raises(KeyboardInterrupt):
            with collector.holding([0, 1]):
                pass
    finally:
        collector._lock = lock
    assert collector._holds == {}
