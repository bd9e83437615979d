"""How ``map`` waits after a round of outcome polls that brought nothing (many outcomes to
come): a short sleep first, doubling while rounds stay empty, never more than a poll interval;
once outcomes arrive, by their pace (``daskqueue.outcome_rest``). A flat 50 ms sleep made a 20,000-task durable map whose
outcomes landed just after an empty round wait out the rest of it (benchmarks/README.md,
issue 24, "durable map of 20,000")."""

from __future__ import annotations

import functools
import threading
import time
import types

import pytest

from daskqueue import defaults
from tests import gate_tasks, tasks


@pytest.mark.timeout(90)
def test_map_rests_short_after_an_empty_round_then_doubles_up_to_a_poll_interval(pools, monkeypatch, tmp_path):
    import daskqueue.outcomes as outcomes

    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread", batch_size=1)  # outcomes one by one, as below
    cp.start()
    qp.map(tasks.double, range(4))  # consumers warm: the map below waits on its tasks only
    sleeps: list[float] = []
    main = threading.current_thread()
    release = tmp_path / "release"

    def sleep(seconds: float) -> None:
        if threading.current_thread() is main:
            sleeps.append(seconds)
            if len(sleeps) == 4:  # four empty rounds seen: the tasks may end now
                release.touch()
        time.sleep(seconds)

    # The outcomes module's clock, with its sleeps recorded (other modules keep theirs).
    monkeypatch.setattr(outcomes, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    n = 40  # > PRIME_MAX_MESSAGES: the map sleeps between empty rounds instead of long-polling
    # The tasks end only once the map has rested four times: its first rounds are empty
    # however slowly a loaded machine runs them (a fixed 0.1 s task was over before a slow
    # map's fourth round, which then brought an outcome and restarted the rests at 1 ms).
    gated = functools.partial(gate_tasks.run_until_released, started=str(tmp_path / "started"),
                              release=str(release))
    try:
        assert qp.map(gated, range(n), timeout_s=60) == list(range(n))
    finally:
        release.touch()  # a map that never rested leaves no task waiting
    assert len(sleeps) >= 4, f"the map found {len(sleeps)} empty rounds before its outcomes: {sleeps}"
    # The rounds before the release are empty, and each sleep doubles the one before, from 1 ms.
    assert sleeps[0] == pytest.approx(outcomes.FIRST_REST_S)
    assert sleeps[:4] == pytest.approx([outcomes.FIRST_REST_S * 2**k for k in range(4)])
    assert max(sleeps) <= defaults.POLL_INTERVAL_S
    # After the first outcomes the rests follow their pace (the next test).


@pytest.mark.timeout(90)
def test_map_rests_by_the_pace_of_its_outcomes_not_one_ms_after_each(pools, monkeypatch):
    """Outcomes that trickle in (one task per fetch, 0.1 s each, two consumers) are waited for
    by the pace they come at: restarting at 1 ms after every arrival cost 5-6 empty rounds of
    every queue per arrival (branch stream5: 128 -> 95 poll rounds for this map, median of 4)."""
    import daskqueue.outcomes as outcomes

    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread", batch_size=1)
    cp.start()
    qp.map(tasks.double, range(4))
    sleeps: list[float] = []
    main = threading.current_thread()

    def sleep(seconds: float) -> None:
        if threading.current_thread() is main:
            sleeps.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(outcomes, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    n = 40  # the first 24 outcomes are slept for (more than PRIME_MAX_MESSAGES to come)
    assert qp.map(functools.partial(tasks.sleep_then, seconds=0.1), range(n), timeout_s=60) == list(range(n))
    # 1 ms only before the first outcome and right after it (no pace known yet): every
    # later arrival leaves many to come, and the rest follows their pace.
    assert sleeps.count(outcomes.FIRST_REST_S) <= 3, sleeps
    assert max(sleeps) <= defaults.POLL_INTERVAL_S


@pytest.mark.timeout(10)
def test_the_rest_plan_short_where_the_map_may_end_by_the_pace_elsewhere():
    from daskqueue.outcome_rest import FIRST_REST_S, MapRest

    rest = MapRest()
    assert [rest.next() for _ in range(4)] == pytest.approx([FIRST_REST_S * 2**k for k in range(4)])
    rest.arrived(1.0, 10, 1000)  # the first arrival: no pace yet, short again
    assert rest.next() == pytest.approx(FIRST_REST_S)
    rest.arrived(1.04, 10, 990)  # 40 ms apart: half of it, then quarters
    assert [rest.next() for _ in range(3)] == pytest.approx([0.02, 0.01, 0.01])
    rest.arrived(1.08, 10, 10)  # as many to come as the last round brought: maybe the last
    assert [rest.next() for _ in range(2)] == pytest.approx([FIRST_REST_S, 2 * FIRST_REST_S])
    rest.arrived(2.0, 1, 5)  # a long pause: capped at a poll interval
    assert rest.next() <= defaults.POLL_INTERVAL_S


@pytest.mark.timeout(90)
def test_as_completed_of_ids_it_cannot_claim_rests_by_the_pace_not_a_flat_poll_interval(pools, monkeypatch):
    """``as_completed`` of ids given with a repeat (not claimed by runs: taken from the
    results as they are filed) slept a flat poll interval after each empty round."""
    import daskqueue.outcomes as outcomes

    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread", batch_size=1)
    cp.start()
    qp.map(tasks.double, range(4))
    ids = qp.batch_submit([(functools.partial(tasks.sleep_then, seconds=0.1), i) for i in range(40)])
    sleeps: list[float] = []
    main = threading.current_thread()

    def sleep(seconds: float) -> None:
        if threading.current_thread() is main:
            sleeps.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(outcomes, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    got = dict(cp.as_completed(ids + ids[:1], timeout=60))
    assert sorted(got.values()) == list(range(40))
    assert sleeps and min(sleeps) < defaults.POLL_INTERVAL_S, sleeps
    assert max(sleeps) <= defaults.POLL_INTERVAL_S
