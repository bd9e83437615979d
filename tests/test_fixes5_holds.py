"""The collector's holds (``ResultCollector.holding``) stay exact when a ``KeyboardInterrupt``
lands between any two lines of taking or releasing them: a Ctrl-C between counting a hold
up and recording it left the hold on for good, so that queue's outcomes were never filed and
a ``map`` on it hung. Pure: the collector is never asked to call a queue."""

from __future__ import annotations

import sys

import pytest

import daskqueue.outcome_polls as outcome_polls
from daskqueue.results import ResultCollector


def _collector() -> ResultCollector:
    def call(*_args):
        raise AssertionError("no queue is called")
    return ResultCollector(4, call, call)


class _Interrupt:
    """A tracer raising ``KeyboardInterrupt`` at the ``at``-th line run in outcome_polls.py."""

    def __init__(self, at: int, functions: tuple[str, ...] | None = None) -> None:
        self.at = at
        self.lines = 0
        self.fired = False
        self.functions = functions  # only lines of these (None: any, until the body runs)
        self.entered = False  # the ``with`` body runs: the entry is over

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename != outcome_polls.__file__:
            return None
        return self._local

    def _local(self, frame, event, arg):
        if self.functions is None and self.entered:
            return self._local
        if self.functions is not None and frame.f_code.co_name not in self.functions:
            return self._local
        if event == "line" and not self.fired:
            self.lines += 1
            if self.lines == self.at:
                self.fired = True
                raise KeyboardInterrupt
        return self._local


def _run(collector: ResultCollector, queues: list[int], tracer: _Interrupt) -> None:
    """Hold ``queues`` with ``tracer`` on (an interrupt it raises is swallowed)."""
    sys.settrace(tracer)
    try:
        with collector.holding(queues):
            tracer.entered = True
            assert set(queues) <= set(collector._holds)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("queues", [[1], [0, 1, 2], [0, 1, 2, 3]])
@pytest.mark.parametrize("where", ["entry", "release"])
def test_holds_are_exact_when_interrupted_between_any_two_lines(queues, where):
    """Interrupted at each line of the entry (up to the ``with`` body), or of the setting of
    the counts on the way out: no hold stays, and another's is kept."""
    functions = None if where == "entry" else ("_set_holds",)
    total = None
    at = 1
    while total is None or at <= total:
        collector = _collector()
        # Another send holds queue 1 meanwhile: an interrupted hold must neither keep one of
        # its own nor release the other's.
        with collector.holding([1]):
            tracer = _Interrupt(at, functions)
            _run(collector, queues, tracer)
            assert collector._holds == {1: 1}, (at, collector._holds)
        assert collector._holds == {}, (at, collector._holds)
        if not tracer.fired:
            total = tracer.lines  # every line was interrupted once: done
        at += 1
    assert total and total >= 4


@pytest.mark.timeout(30)
def test_an_answer_kept_aside_is_filed_when_the_hold_ends():
    collector = _collector()
    with collector.holding([2]):
        collector._held.setdefault(2, []).append(([], []))
        assert 2 in collector._held
    assert collector._holds == {} and collector._held == {}
