"""``compute_backoff``: exponential, capped, jittered downwards, deterministic given its rng."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daskqueue.queue.backoff import compute_backoff


def backoff(attempt, *, base_s=1.0, max_s=1000.0, jitter=0.0, seed=0):
    return compute_backoff(
        attempt, base_s=base_s, max_s=max_s, jitter=jitter, rng=random.Random(seed)
    )


def test_first_retry_waits_the_base_delay():
    assert backoff(1, base_s=0.25) == 0.25


@pytest.mark.parametrize("attempt, expected", [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (10, 512.0)])
def test_delay_doubles_with_each_attempt(attempt, expected):
    assert backoff(attempt) == expected


def test_delay_is_capped_at_max():
    assert [backoff(a, max_s=5.0) for a in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.parametrize("attempt", [61, 1_000, 10**9])
def test_a_huge_attempt_number_is_capped_without_overflow(attempt):
    assert backoff(attempt, max_s=30.0) == 30.0


def test_zero_base_never_waits():
    assert backoff(5, base_s=0.0) == 0.0


def test_zero_jitter_is_exact():
    assert {backoff(3, seed=s) for s in range(20)} == {4.0}


def test_jitter_scales_the_delay_down_never_up():
    delays = [backoff(3, jitter=0.5, seed=s) for s in range(200)]
    assert all(2.0 <= d <= 4.0 for d in delays)
    assert len(set(delays)) > 1


def test_full_jitter_spreads_over_zero_to_the_delay():
    delays = [backoff(1, base_s=10.0, jitter=1.0, seed=s) for s in range(200)]
    assert all(0.0 <= d <= 10.0 for d in delays)
    assert min(delays) < 2.0 and max(delays) > 8.0


def test_jitter_applies_after_the_cap():
    delays = [backoff(20, max_s=6.0, jitter=0.5, seed=s) for s in range(100)]
    assert all(3.0 <= d <= 6.0 for d in delays)


def test_same_seed_gives_the_same_delays():
    def draws(seed):
        rng = random.Random(seed)
        return [
            compute_backoff(a, base_s=1.0, max_s=60.0, jitter=0.7, rng=rng) for a in range(1, 9)
        ]

    assert draws(42) == draws(42)
    assert draws(42) != draws(43)


def test_each_call_draws_from_the_rng_it_is_given():
    rng = random.Random(5)
    first = compute_backoff(1, base_s=1.0, max_s=1.0, jitter=1.0, rng=rng)
    second = compute_backoff(1, base_s=1.0, max_s=1.0, jitter=1.0, rng=rng)
    assert first != second


@pytest.mark.parametrize("attempt", [0, -1])
def test_rejects_an_attempt_below_one(attempt):
    with pytest.raises(ValueError, match="attempt"):
        backoff(attempt)


@pytest.mark.parametrize("jitter", [-0.01, 1.01, float("nan")])
def test_rejects_jitter_outside_the_unit_interval(jitter):
    with pytest.raises(ValueError, match="jitter"):
        backoff(1, jitter=jitter)


@pytest.mark.parametrize("jitter", [0.0, 1.0])
def test_accepts_jitter_at_the_bounds_of_the_unit_interval(jitter):
    assert 0.0 <= backoff(1, jitter=jitter) <= 1.0


@given(
    attempt=st.integers(1, 200),
    # compute_backoff clamps the exponent at 60 to avoid overflow; that equals the formula unless
    # base_s * 2**60 < max_s, which needs a base far below any real delay
    base_s=st.just(0.0) | st.floats(1e-9, 10.0),
    max_s=st.floats(0.0, 100.0),
    jitter=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
)
def test_delay_lies_within_the_jitter_band_of_the_capped_exponential(
    attempt, base_s, max_s, jitter, seed
):
    delay = min(max_s, base_s * 2.0 ** (attempt - 1))
    got = backoff(attempt, base_s=base_s, max_s=max_s, jitter=jitter, seed=seed)
    assert (1.0 - jitter) * delay * (1 - 1e-12) <= got <= delay
