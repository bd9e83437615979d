"""``map``'s rest after empty rounds (daskqueue.outcome_rest, pure: no cluster) reaches a poll
interval within a bounded number of empty rounds, whatever the arrivals before were. After
a fast pace (< 4 ms) the rest stayed at 1 ms for good, so a stalled map (slow tail tasks, a
lost worker awaiting its lease's expiry) asked every queue every millisecond."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskqueue import defaults
from daskqueue.outcome_rest import FIRST_REST_S, MapRest

CAP = defaults.POLL_INTERVAL_S
#: Empty rounds after any arrival by which the rest is a poll interval: up to 20 rounds of a
#: quarter pace (two paces, or STALLED_S of 1 ms rests), then at most 6 doublings from 1 ms
#: to 50 ms.
BOUND = 28

arrivals = st.lists(
    st.tuples(st.floats(min_value=0.0, max_value=5.0),  # time since the previous round with outcomes
              st.integers(min_value=1, max_value=1000),  # outcomes it brought
              st.integers(min_value=0, max_value=100_000),  # still to come
              st.integers(min_value=0, max_value=20)),  # empty rounds after it
    min_size=1, max_size=30)


def _play(rest: MapRest, plan: list[tuple[float, int, int, int]]) -> float:
    now = 100.0
    for gap, count, pending, empties in plan:
        now += gap
        rest.arrived(now, count, pending)
        for _ in range(empties):
            now += rest.next()
    return now


@pytest.mark.timeout(60)
@settings(max_examples=400, deadline=None)
@given(plan=arrivals)
def test_empty_rounds_reach_a_poll_interval_in_a_bounded_number_after_any_arrivals(plan):
    rest = MapRest()
    _play(rest, plan)
    rests = [rest.next() for _ in range(BOUND + 10)]
    assert all(FIRST_REST_S <= r <= CAP for r in rests), rests
    assert rests[BOUND:] == pytest.approx([CAP] * 10), rests


@pytest.mark.timeout(10)
@pytest.mark.parametrize("pace", [0.0005, 0.001, 0.002, 0.003, 0.004, 0.01, 0.04, 0.2])
def test_a_stall_after_a_fast_pace_doubles_to_a_poll_interval(pace):
    rest = MapRest()
    for k in range(20):
        rest.arrived(1.0 + k * pace, 10, 100_000)
    rests = [rest.next() for _ in range(40)]
    assert rests[-1] == pytest.approx(CAP), rests
    assert sum(r < CAP for r in rests) <= BOUND, rests
    # The pace still sets the first rests: half of it, then quarters (at least 1 ms).
    assert rests[0] == pytest.approx(max(FIRST_REST_S, min(CAP, pace / 2)))
    assert rests[1] == pytest.approx(max(FIRST_REST_S, min(CAP, pace / 4)))


@pytest.mark.timeout(10)
def test_rests_within_two_paces_stay_at_the_quarter_pace():
    rest = MapRest()
    rest.arrived(1.0, 10, 1000)
    rest.arrived(1.04, 10, 990)  # a 40 ms pace: 20 ms, then 10 ms until 80 ms were rested
    assert [rest.next() for _ in range(8)] == pytest.approx([0.02, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.02])
    rest.arrived(1.2, 10, 980)  # an arrival starts the pace's rests again
    assert rest.next() == pytest.approx(min(CAP, (0.04 + 0.16) / 2 / 2))
