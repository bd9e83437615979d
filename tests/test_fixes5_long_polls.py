"""A long poll left in flight (by a send's prime, or by a ``first`` poll that returned on
another queue's outcomes) to a queue removed meanwhile is dropped: it stayed in the
collector's table of long polls for good. Pure: the queues are stand-ins of the collector's
``call``/``answer`` (no Dask)."""

from __future__ import annotations

import pytest

from daskqueue.results import ResultCollector
from daskqueue.serialize import encode_records


class _InFlight:
    """A call not answered yet (``future.done()`` is False)."""

    class future:  # noqa: N801  (read as an attribute, as a pending's future)
        @staticmethod
        def done() -> bool:
            return False


class _Answered:
    future = None  # answered already


def _collector(n: int = 4) -> tuple[ResultCollector, list[tuple[int, str, tuple]]]:
    calls: list[tuple[int, str, tuple]] = []

    def call(q, method, *args):
        calls.append((q, method, args))
        wait_s = args[2] if len(args) > 2 else 0.0
        return _InFlight() if wait_s > 0 else _Answered()

    def answer(q, pending, deadline=None):
        if isinstance(pending, _InFlight):
            raise AssertionError("a long poll in flight is waited on")
        return 0, encode_records([]), 0, []

    return ResultCollector(n, call, answer), calls


@pytest.mark.timeout(30)
def test_the_long_poll_of_a_removed_queue_is_dropped_by_the_next_poll():
    collector, _ = _collector()
    collector.prime([1, 3])  # long polls in flight at queues 1 and 3
    assert set(collector._long) == {1, 3}
    collector.removed.add(3)  # removed meanwhile (its outcomes fetched by remove_queue)
    collector.poll(wait_s=0.0)
    assert set(collector._long) == {1}


@pytest.mark.timeout(30)
def test_forget_drops_a_removed_queues_long_poll():
    collector, _ = _collector()
    collector.prime([2])
    collector.removed.add(2)
    collector.forget(2)
    assert collector._long == {}
