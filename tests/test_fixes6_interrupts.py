"""A Ctrl-C during a send that ends with an ordinary error, or while an interrupted send
reads its puts' answers: never lost, never raised without the send's ``stored_ids``.

Pure tests, no cluster: a ``Sender`` whose puts and bookkeeping are patched to fail, and the
interrupts real SIGINTs raised on the main thread (``signal.raise_signal``) through the
guard the send installs."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from daskqueue.queue import sending
from daskqueue.queue.interrupted import InterruptGuard, SentPut, read_rest
from daskqueue.queue.sending import Sender

pytestmark = pytest.mark.timeout(30)

N = 4


def batch():
    """An encoded batch of ``N`` messages, as far as a send that fails looks at it."""
    return ([SimpleNamespace(count=N)], [], [range(N)])


def failing_sender(monkeypatch, *, on_failure=None):
    """A sender whose one put fails unsent (a ValueError); ``on_failure`` runs as that
    failure is raised (interrupts deferred then: the send is whole)."""
    sender = Sender(None, None, None)

    def put_routed(q, put, reroute, hold):
        raise ValueError("put failed")

    monkeypatch.setattr(sender, "_put_routed", put_routed)
    real = sender._failure

    def failure(errors, ids):
        if on_failure is not None:
            on_failure()
        return real(errors, ids)

    monkeypatch.setattr(sender, "_failure", failure)
    return sender


@pytest.fixture
def sigint_handler():
    """Put back the SIGINT handler a test replaces."""
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_as_a_send_fails_is_raised_from_its_error_with_the_stored_ids(monkeypatch, sigint_handler):
    # Without the fix the ValueError was raised and the Ctrl-C dropped.
    sender = failing_sender(monkeypatch, on_failure=lambda: signal.raise_signal(signal.SIGINT))
    with pytest.raises(KeyboardInterrupt) as info:
        sender.send([batch()], n=N, queues=[0])
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.stored_ids == [None] * N
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_as_a_send_fails_reaches_a_handler_that_raises_nothing(monkeypatch, sigint_handler):
    calls = []
    signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    sender = failing_sender(monkeypatch, on_failure=lambda: signal.raise_signal(signal.SIGINT))
    with pytest.raises(ValueError) as info:
        sender.send([batch()], n=N, queues=[0])
    assert calls == [signal.SIGINT]  # without the fix: never called
    assert info.value.stored_ids == [None] * N


def interrupted_by_bookkeeping(monkeypatch, read):
    """A sender whose one put goes out, whose outcome-poll priming then fails (a
    RuntimeError: the interruption), and whose reading of that put's answer is ``read``."""
    sender = Sender(None, None, SimpleNamespace(prime=lambda queues: (_ for _ in ()).throw(RuntimeError("prime"))))

    def put_all(batches, queues, reroute, hold, sends, errors):
        put = SentPut(batches[0])
        put.live = (0, b"", b"", None)
        sends.append(put)

    monkeypatch.setattr(sender, "_put_all", put_all)
    monkeypatch.setattr(sender, "_read", read)
    return sender


def test_a_ctrl_c_stopping_the_reading_after_a_bookkeeping_error_is_raised(monkeypatch, sigint_handler):
    # The interruption is an ordinary error; a Ctrl-C during the reading of the put's answer
    # stops that reading. Without the fix it was consumed there and the RuntimeError raised:
    # a caller retrying on Exception never saw the Ctrl-C.
    def read(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # while the answer is awaited: raised at once

    sender = interrupted_by_bookkeeping(monkeypatch, read)
    with pytest.raises(KeyboardInterrupt) as info:
        sender.send([batch()], n=N, queues=[0])
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.stored_ids == [None] * N


def test_a_ctrl_c_deferred_between_two_reads_is_owed_by_read_rest(sigint_handler):
    # The first read's bookkeeping fails again; a Ctrl-C lands as that failure is noted
    # (interrupts deferred): it stops the reading, and is owed (without the fix: cleared).
    errors = []

    def read(send, deadline):
        raise ValueError("bookkeeping")

    def queue_of(send):
        signal.raise_signal(signal.SIGINT)
        return 0

    with InterruptGuard() as guard:
        guard.deferring = True
        read_rest(read, ["first", "second"], guard, 5.0, errors, queue_of)
    assert len(errors) == 1
    assert guard.late is not None
    with pytest.raises(KeyboardInterrupt) as info:
        guard.raise_owed(RuntimeError("the interruption"))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_ctrl_c_owed_is_dropped_when_the_send_raises_a_keyboard_interrupt_already():
    guard = InterruptGuard()
    guard.late = (signal.SIGINT, None)
    guard.raise_owed(KeyboardInterrupt())  # returns: the caller raises that one
    assert guard.late is None


def test_a_sigint_as_the_guard_restores_the_handler_raises_a_keyboard_interrupt(sigint_handler):
    # __exit__ cleared the handler it restores before restoring it: a SIGINT in between
    # (deferring off) called None (a TypeError). Here, that moment held still.
    guard = InterruptGuard()
    guard.__enter__()
    try:
        guard._previous = None
        with pytest.raises(KeyboardInterrupt):
            guard._handle(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class LandsAsDeferred(InterruptGuard):
    """A guard on which a Ctrl-C lands just before ``deferring`` is next set (once, and as
    the guard's handler does it: deferring on, then the KeyboardInterrupt)."""

    armed = True

    @property
    def deferring(self):
        return InterruptGuard.deferring.__get__(self)

    @deferring.setter
    def deferring(self, value):
        InterruptGuard.deferring.__set__(self, value or self.armed)
        if value and self.armed:
            self.armed = False
            raise KeyboardInterrupt


def test_a_ctrl_c_landing_as_a_read_ends_stops_the_reading_without_leaving_it():
    # Without the fix the KeyboardInterrupt left read_rest (the send then raised with no
    # stored_ids).
    reads = []
    guard = LandsAsDeferred()
    guard.armed = False
    guard.deferring = True
    guard.armed = True
    read_rest(lambda send, deadline: reads.append(send), ["first", "second"], guard, 5.0, [], lambda s: 0)
    assert reads == ["first"]
    assert isinstance(guard.stopped, KeyboardInterrupt)


def test_a_ctrl_c_landing_as_an_error_is_handled_is_raised_with_the_stored_ids(monkeypatch):
    # The first error is an ordinary one (interrupts not deferred); a Ctrl-C lands as its
    # handling starts. Without the fix it left the handling: raised with no stored_ids.
    sender = Sender(None, None, None)

    def put_all(*args):
        raise RuntimeError("the client's own bookkeeping")

    monkeypatch.setattr(sender, "_put_all", put_all)
    monkeypatch.setattr(sending, "InterruptGuard", LandsAsDeferred)
    with pytest.raises(KeyboardInterrupt) as info:
        sender.send([batch()], n=N, queues=[0])
    assert info.value.stored_ids == [None] * N
