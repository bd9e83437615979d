"""A stream's wait while a chunk is being sent (``Streaming._wait``), with the pool's parts
stood in for (what it decides is pure: which poll, and whether it checks the consumers):

* the send holds only some queues (a stream routed by ``queue=``/``key=``): it long-polls in
  short slices, so outcomes at the queues not held are seen as they come; it polled without
  a wait and then waited up to 50 ms on the send, leaving those unseen meanwhile;
* the consumers are checked during a send too (a ``continue`` skipped the check).
"""

from __future__ import annotations

import types

import pytest

from daskqueue.queue.streaming import Streaming


class _Stream:
    timeout_s = None
    put = 10
    yielded = 0

    def __init__(self, ready_after: int) -> None:
        self.polls = 0
        self.ready_after = ready_after

    def has_ready(self) -> bool:
        return self.polls >= self.ready_after


class _Sends:
    def __init__(self) -> None:
        self.waits: list[float] = []

    def check(self) -> None:
        pass

    def under_way(self) -> bool:
        return True  # a send goes on for the whole test

    def wait_under_way(self, timeout_s: float) -> None:
        self.waits.append(timeout_s)


def _pool(stream: _Stream, *, holds_all: bool, consumers: bool = True):
    polls: list[float] = []
    no_consumers: list[bool] = []

    def poll(*, wait_s=0.0, deadline=None, first=False, queue_index=None):
        polls.append(wait_s)
        stream.polls += 1
        return 0

    pool = types.SimpleNamespace(
        outcomes=types.SimpleNamespace(poll=poll),
        collector=types.SimpleNamespace(holds_all=lambda: holds_all),
        check_scheduler=lambda: None,
        has_running_consumers=lambda: consumers,
        _no_consumers=lambda s, deadline: no_consumers.append(True),
    )
    return pool, polls, no_consumers


@pytest.mark.timeout(30)
def test_a_send_holding_some_queues_long_polls_the_others_in_short_slices():
    stream, sends = _Stream(ready_after=3), _Sends()
    pool, polls, _ = _pool(stream, holds_all=False)
    Streaming._wait(pool, stream, sends)
    assert polls and all(0 < w <= 0.01 for w in polls), polls
    assert sends.waits == []  # nothing waited on the send while outcomes may come elsewhere


@pytest.mark.timeout(30)
def test_a_send_holding_every_queue_polls_without_a_wait_then_waits_on_the_send():
    stream, sends = _Stream(ready_after=3), _Sends()
    pool, polls, _ = _pool(stream, holds_all=True)
    Streaming._wait(pool, stream, sends)
    assert polls == [0.0, 0.0, 0.0]
    assert len(sends.waits) == 2  # after each poll that left nothing to yield


@pytest.mark.timeout(30)
@pytest.mark.parametrize("holds_all", [True, False])
def test_the_consumers_are_checked_during_a_send(holds_all):
    stream, sends = _Stream(ready_after=3), _Sends()
    pool, _, no_consumers = _pool(stream, holds_all=holds_all, consumers=False)
    Streaming._wait(pool, stream, sends)
    assert no_consumers, "no consumer runs, and the wait never checked during the send"


@pytest.mark.timeout(30)
def test_holds_all_says_whether_every_queue_polled_is_held():
    from daskqueue.results import ResultCollector

    def call(*_args):
        raise AssertionError("no queue is called")

    collector = ResultCollector(3, call, call)
    assert not collector.holds_all()
    with collector.holding([0, 1]):
        assert not collector.holds_all()  # queue 2's outcomes are filed meanwhile
        collector.removed.add(2)
        assert collector.holds_all()  # a removed queue is not polled
    assert not collector.holds_all()
