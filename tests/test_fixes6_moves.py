"""``move_from`` reading the answers of its sources' ``move_out`` calls: a source that moved
meanwhile is asked again with time of its own, and a Ctrl-C leaves no answer unread. Pure
tests, no cluster: a stand-in for the pool's queue table whose answers come as each test
says (the logic under test is move_from's, which only calls the table)."""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import pytest

from daskqueue import defaults
from daskqueue.errors import QueueCallTimeoutError, QueueMovedError
from daskqueue.queue.resize import move_from
from daskqueue.queue.table import QueueTable

pytestmark = pytest.mark.timeout(30)

CALL_S = 0.5


class Table:
    """Queues 1 and 2 each move 5 messages to queue 0; ``answers[q]`` gives each call's
    answer in turn: ``(seconds it takes, what it does)``. A call is answered by its deadline
    or times out, as the real table's ``answer``."""

    def __init__(self, answers):
        self.answers = answers
        self.put_counts = [0, 5, 5]
        self.handles = [SimpleNamespace(_address="tcp://x:1")] * 3

    answer_or_ask_again = QueueTable.answer_or_ask_again  # the real one, on these answers

    def call(self, q, method, *args):
        return SimpleNamespace(q=q, method=method, args=args, turn=self.answers[q].pop(0))

    def answer(self, q, pending, deadline):
        takes, what = pending.turn
        if time.monotonic() + takes > deadline:
            time.sleep(max(0.0, deadline - time.monotonic()))
            raise QueueCallTimeoutError(q, pending.method, 0.0)
        time.sleep(takes)
        if isinstance(what, BaseException):
            raise what
        return [(0, 5, 0, 100 * q)], []


def pool_with(table):
    collector = SimpleNamespace(moves=[], holding=lambda nodes: contextlib.nullcontext())
    collector.moved = lambda runs, q: collector.moves.append(q)
    return SimpleNamespace(table=table, router=SimpleNamespace(typed=False), collector=collector)


def test_a_source_asked_again_after_a_slow_one_gets_time_of_its_own(monkeypatch):
    # Source 1 answers just within the shared deadline; source 2 moved meanwhile, and its
    # second call takes a moment. Without the fix that call had the shared deadline, spent:
    # it timed out though the move happened, and source 2's moves went unrecorded.
    monkeypatch.setattr(defaults, "CALL_TIMEOUT_S", CALL_S)
    table = Table({1: [(CALL_S * 0.8, None)], 2: [(0.0, QueueMovedError(2, "tcp://x:1")), (CALL_S * 0.4, None)]})
    pool = pool_with(table)
    assert move_from(pool, [1, 2], [0], everything=True) == 10
    assert pool.collector.moves == [1, 2]
    assert table.put_counts == [10, 0, 0]


def test_a_ctrl_c_while_one_answer_is_awaited_leaves_no_other_answer_unread(monkeypatch):
    monkeypatch.setattr(defaults, "CALL_TIMEOUT_S", CALL_S)
    table = Table({1: [(0.0, KeyboardInterrupt())], 2: [(0.0, None)]})
    pool = pool_with(table)
    with pytest.raises(KeyboardInterrupt):
        move_from(pool, [1, 2], [0], everything=True)
    assert pool.collector.moves == [2]  # before the fix: [] (source 2's moves never recorded)
    assert table.put_counts == [5, 5, 0]
