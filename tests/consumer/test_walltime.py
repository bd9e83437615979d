"""The pure walltime decision: per-type duration estimates, what a consumer still fetches and
runs before its worker leaves, and SLURM's time-left format (no clock, no cluster)."""

from __future__ import annotations

import pytest

from daskqueue.consumer.walltime import DurationEstimates, WalltimeGuard, parse_slurm_time_left

pytestmark = pytest.mark.timeout(30)

END = 1_000_000.0  # the worker leaves then (epoch seconds)


def guard(*samples, margin_s=2.0, **kw):
    """A guard over estimates fed ``(done, run_s, types)`` batches."""
    est = DurationEstimates(**kw)
    for done, run_s, types in samples:
        est.observe(done, run_s, types)
    return WalltimeGuard(END, est, margin_s=margin_s)


def test_an_estimate_is_a_high_quantile_of_recent_items_of_the_type_with_a_safety_factor():
    est = DurationEstimates(window=20, quantile=0.95, safety=1.5)
    for s in [1.0] * 18 + [3.0, 10.0]:
        est.observe(1, s, ["a"])
    assert est.estimate("a") == pytest.approx(3.0 * 1.5)  # the 19th of 20: the one outlier dropped
    est.observe(4, 2.0, ["b", "b"])  # a batch's mean per item
    assert est.estimate("b") == pytest.approx(0.5 * 1.5)


def test_the_window_forgets_old_durations():
    est = DurationEstimates(window=3, quantile=1.0, safety=1.0)
    est.observe(1, 9.0, [None])
    for _ in range(3):
        est.observe(1, 1.0, [None])
    assert est.estimate(None) == 1.0


def test_an_unseen_type_counts_as_the_slowest_seen_and_nothing_seen_is_unknown():
    est = DurationEstimates(quantile=1.0, safety=1.0)
    assert est.estimate("x") is None and est.worst() is None
    est.observe(1, 0.1, ["short"])
    est.observe(1, 5.0, ["long"])
    assert est.estimate("new") == est.worst() == 5.0


@pytest.mark.parametrize("bad", [dict(window=0), dict(quantile=0.0), dict(quantile=1.5), dict(safety=0.5)])
def test_bad_estimator_settings_are_refused(bad):
    with pytest.raises(ValueError):
        DurationEstimates(**bad)


def test_far_from_the_end_the_sizers_batch_is_fetched_whole_even_ahead():
    g = guard((1, 1.0, [None]), quantile=1.0, safety=1.0)
    assert g.items_to_fetch(END - 1000, 50, thread_free=False) == 50


def test_near_the_end_only_what_ends_in_time_is_fetched_and_nothing_ahead():
    g = guard((1, 2.0, [None]), quantile=1.0, safety=1.5)  # 3 s an item
    now = END - 2.0 - 10.0  # 10 s of work left before the margin
    assert g.items_to_fetch(now, 50, thread_free=True) == 3
    assert g.items_to_fetch(now, 50, thread_free=False) == 0  # it would wait for a thread
    assert g.items_to_fetch(END - 2.0 - 2.9, 50, thread_free=True) == 0  # not even one item
    assert g.items_to_fetch(END - 1.0, 1, thread_free=True) == 0  # inside the margin


def test_with_nothing_measured_one_item_at_a_time_is_fetched_until_the_margin():
    g = guard()
    assert g.items_to_fetch(END - 100, 50, thread_free=True) == 1
    assert g.items_to_fetch(END - 1.0, 50, thread_free=True) == 0
    assert g.fits(END - 100, {"x": 1000}) and not g.fits(END - 1.0, {"x": 1})


def test_a_batch_fits_by_the_estimates_of_its_own_types():
    g = guard((1, 0.1, ["short"]), (1, 4.0, ["long"]), quantile=1.0, safety=1.0)
    now = END - 2.0 - 5.0  # 5 s left
    assert g.fits(now, {"short": 40})  # 4 s
    assert not g.fits(now, {"long": 2})  # 8 s
    assert g.fits(now, {"long": 1})
    assert not g.fits(now, {"short": 20, "unseen": 1})  # 2 s + the slowest, 4 s
    assert not g.done(now) and g.done(END - 2.0)


@pytest.mark.parametrize("text, seconds", [
    ("9:58", 598.0), ("1:00:00", 3600.0), ("2-03:04:05", ((2 * 24 + 3) * 60 + 4) * 60 + 5.0),
    ("0:00", 0.0), (" 12:34:56\n", 45296.0),
])
def test_squeue_time_left_is_read_in_seconds(text, seconds):
    assert parse_slurm_time_left(text) == seconds


@pytest.mark.parametrize("text", ["UNLIMITED", "NOT_SET", "INVALID", "", "soon"])
def test_a_job_without_a_time_limit_has_no_end(text):
    assert parse_slurm_time_left(text) is None
