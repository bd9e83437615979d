"""``poll(first=True)`` over many queues returns once any queue's long poll brings
outcomes: it waited on the long polls one after another in queue order, so an outcome at
the last of 32 queues sat unseen until every earlier queue's poll had ended (a poll
interval on every stall of an ``imap``/``as_completed``). Pure: the queues are stand-ins of
the collector's ``call``/``answer`` whose answers come when the test says (no Dask)."""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from daskqueue.errors import QueueCallTimeoutError
from daskqueue.results import ResultCollector
from daskqueue.serialize import ResultRecord, encode_records

N = 32


class _Call:
    """A long poll at queue ``q``: answered once the test sets ``ready`` (or its wait ends)."""

    def __init__(self, q: int, wait_s: float) -> None:
        self.q = q
        self.ready = threading.Event()
        self.expires = time.monotonic() + wait_s
        self.future = self

    def done(self) -> bool:
        return self.ready.is_set() or time.monotonic() >= self.expires


class _Queues:
    def __init__(self) -> None:
        self.calls: dict[int, _Call] = {}
        self.waits: dict[int, float] = {}  # the longest single wait on each queue's poll

    def call(self, q, method, *args):
        assert method == "fetch_outcomes"
        self.calls[q] = _Call(q, args[2] if len(args) > 2 else 0.0)
        return self.calls[q]

    def answer(self, q, pending, deadline=None):
        start = time.monotonic()
        end = min(pending.expires, deadline if deadline is not None else pending.expires)
        got = pending.ready.wait(max(0.0, end - start))
        self.waits[q] = max(self.waits.get(q, 0.0), time.monotonic() - start)
        if got:
            record = ResultRecord(q, [(0, 1)], [], pickle.dumps([q * 10]), None)
            return 1, encode_records([record]), 0, []
        if time.monotonic() >= pending.expires:
            return 0, encode_records([]), 0, []  # the queue's wait ended: nothing
        raise QueueCallTimeoutError(q, "fetch_outcomes", round(end - start, 3))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("at", [N - 1, N // 2, 0])
def test_a_first_poll_returns_on_the_outcome_of_any_queue_not_after_the_polls_before_it(at):
    queues = _Queues()
    collector = ResultCollector(N, queues.call, queues.answer)
    wait_s = 5.0  # each long poll's wait: the poll returns well before, once queue ``at`` answers
    timer = threading.Timer(0.05, lambda: queues.calls[at].ready.set())
    timer.start()
    try:
        start = time.monotonic()
        n = collector.poll(wait_s=wait_s, first=True)
        took = time.monotonic() - start
    finally:
        timer.cancel()
    assert n == 1
    assert list(collector.results.values()) == [at * 10]
    # No queue's poll was waited on for long: each in turn for a slice (before: queue 0's
    # for the whole wait, then queue 1's...).
    assert max(queues.waits.values()) < wait_s / 2, queues.waits
    assert took < wait_s / 2, took
    # The other queues' long polls stay in flight for the next poll.
    assert set(collector._long) == set(range(N)) - {at}
