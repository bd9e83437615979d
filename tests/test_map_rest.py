"""How ``map`` waits after a round of outcome polls that brought nothing (many outcomes to
come): a short sleep first, doubling while rounds stay empty, never more than a poll interval,
and short again once outcomes arrive. A flat 50 ms sleep made a 20,000-task durable map whose
outcomes landed just after an empty round wait out the rest of it (benchmarks/README.md,
issue 24, "durable map of 20,000")."""

from __future__ import annotations

import functools
import threading
import time
import types

import pytest

from daskqueue import defaults
from tests import tasks


@pytest.mark.timeout(90)
def test_map_rests_short_after_an_empty_round_then_doubles_up_to_a_poll_interval(pools, monkeypatch):
    import daskqueue.outcomes as outcomes

    qp = pools.queue(2)
    # One task per fetch, so outcomes arrive one by one (an adaptive batch could bring most
    # of them in one burst on a loaded machine, and no second doubling would start).
    cp = pools.consumer(qp, isolation="thread", batch_size=1)
    cp.start()
    qp.map(tasks.double, range(4))  # consumers warm: the map below waits on its tasks only
    sleeps: list[float] = []
    main = threading.current_thread()

    def sleep(seconds: float) -> None:
        if threading.current_thread() is main:
            sleeps.append(seconds)
        time.sleep(seconds)

    # The outcomes module's clock, with its sleeps recorded (other modules keep theirs).
    monkeypatch.setattr(outcomes, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    n = 40  # > PRIME_MAX_MESSAGES: the map sleeps between empty rounds instead of long-polling
    assert qp.map(functools.partial(tasks.sleep_then, seconds=0.1), range(n), timeout_s=60) == list(range(n))
    assert sleeps, "the map never found an empty round"
    # The first outcome comes after 0.1 s: the rounds before it are empty, and each sleep
    # doubles the one before, from 1 ms.
    assert sleeps[0] == pytest.approx(outcomes.FIRST_REST_S)
    assert sleeps[:4] == pytest.approx([outcomes.FIRST_REST_S * 2**k for k in range(4)])
    assert max(sleeps) <= defaults.POLL_INTERVAL_S
    # Outcomes arrive about every 0.1 s per consumer: the doubling starts afresh after them.
    assert sleeps.count(sleeps[0]) >= 2, sleeps
