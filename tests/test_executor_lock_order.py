"""An executor failing the calls of a lost queue never holds a claim's lock while it asks the
collector, whose lock a poll holds while it files outcomes into that claim (review of the
merged branches: the two threads deadlocked)."""

import collections
import threading
import time
from concurrent.futures import Future

import pytest

from daskqueue.executor_thread import _Claim
from daskqueue.messages import make_id
from daskqueue.results import ResultCollector

pytestmark = pytest.mark.timeout(20)


def test_losing_a_queue_while_another_thread_files_outcomes_does_not_deadlock() -> None:
    collector = ResultCollector(2, None, None)  # type: ignore[arg-type]  (no queue is called)
    futures = [Future() for _ in range(4)]
    claim = _Claim(futures, collections.deque(), [make_id(0, s) for s in range(4)])
    collector.claim(0, 0, 4, claim, 0)
    asking = threading.Event()

    def poller() -> None:  # a poll files outcomes with the collector's lock held
        with collector.exclusive():
            asking.wait(2)
            collector._succeed_here(0, 0, [1, 2, 3, 4])

    def executor() -> None:
        def on_lost(i: int) -> bool:
            asking.set()
            time.sleep(0.1)
            return collector.queue_of(i) == 0
        claim.lose(on_lost)

    a = threading.Thread(target=poller, daemon=True)
    b = threading.Thread(target=executor, daemon=True)
    a.start()
    time.sleep(0.05)
    b.start()
    a.join(5)
    b.join(5)
    assert not a.is_alive() and not b.is_alive(), "the poll and the executor deadlocked"
