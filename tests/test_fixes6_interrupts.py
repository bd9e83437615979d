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


