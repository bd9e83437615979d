"""The pure batch sizer: durations in, the next batch size out (no clock, no cluster)."""

from __future__ import annotations

import pytest

from daskqueue.consumer.sizer import MAX_GROWTH, BatchSizer


def sizer(**kw):
    args = dict(fixed=None, initial=10, max_size=10_000, target_batch_s=1.0)
    args.update(kw)
    return BatchSizer(**args)


def test_a_new_sizer_asks_for_the_initial_size():
    assert sizer().size == 10


def test_a_fixed_size_never_changes():
    s = sizer(fixed=7)
    s.observe(7, 100.0)
    s.observe(7, 0.0001)
    s.idle()
    assert s.size == 7 and s.sizes_by_type() is None


@pytest.mark.parametrize(
    "done, elapsed_s, size",
    [
        (10, 5.0, 2),  # 0.5 s per item: two fit in the 1 s target
        (10, 100.0, 1),  # items slower than the target: batches of one
        (0, 10.0, 10),  # a batch that ran nothing teaches nothing
    ],
)
def test_one_batch_sizes_the_next_to_the_target_duration(done, elapsed_s, size):
    s = sizer()
    s.observe(done, elapsed_s)
    assert s.size == size


def test_fast_items_grow_the_batch_at_most_fourfold_per_batch():
    s = sizer()
    s.observe(10, 0.001)
    assert s.size == 10 * MAX_GROWTH
    s.observe(40, 0.004)
    assert s.size == 10 * MAX_GROWTH**2


def test_the_size_never_exceeds_the_maximum():
    s = sizer(max_size=50)
    for _ in range(5):
        s.observe(s.size, 1e-6)
    assert s.size == 50


def test_the_time_per_item_is_a_running_mean():
    s = sizer()
    s.observe(10, 1.0)  # 0.1 s per item
    s.observe(10, 3.0)  # 0.3 s: mean 0.2 s, so 5 fit in 1 s
    assert s.size == 5


def test_idle_forgets_what_was_learned():
    s = sizer()
    s.observe(10, 0.001, ["a"])
    s.observe(10, 5.0, ["b"])
    s.idle()
    assert s.size == 10 and s.sizes_by_type() is None


def test_sizes_by_type_appear_once_two_types_were_seen():
    s = sizer()
    s.observe(10, 5.0, ["slow"])
    assert s.sizes_by_type() is None
    s.observe(10, 0.01, ["fast"])
    sizes = s.sizes_by_type()
    assert sizes is not None and sizes["slow"] < sizes["fast"]


def test_a_batch_of_mixed_types_does_not_size_any_type():
    s = sizer()
    s.observe(10, 1.0, ["a", "b"])
    s.observe(10, 1.0, ["a", "b"])
    assert s.sizes_by_type() is None
