"""The start gate's decisions (``daskqueue.consumer.start_gate``), pure: no Dask, no clock."""

from __future__ import annotations

import pytest

from daskqueue.consumer.start_gate import Arrival, StartGate, Waiting
from daskqueue.consumer.walltime import DurationEstimates, WalltimeGuard


def w(key, *, reserved=False, start_by=None) -> Waiting:
    return Waiting(key, f"batch {key}", reserved=reserved, start_by=start_by)


@pytest.mark.timeout(10)
def test_a_batch_starts_while_a_slot_is_free_and_waits_in_arrival_order_when_none_is():
    gate = StartGate(general=2)
    assert gate.arrive(w(1), now=0) is Arrival.START
    assert gate.arrive(w(2), now=0) is Arrival.START
    assert gate.arrive(w(3), now=0) is Arrival.WAIT
    assert gate.arrive(w(4), now=0) is Arrival.WAIT
    gate.validate()
    assert (gate.running(), gate.waiting) == (2, 2)
    nxt, refused = gate.finished(False, now=1)
    assert (nxt.key, refused) == (3, [])  # the thread that ended runs the oldest waiting one
    gate.validate()
    assert gate.finished(False, now=1)[0].key == 4
    assert gate.finished(False, now=1) == (None, [])
    assert gate.finished(False, now=1) == (None, [])
    gate.validate()
    assert (gate.running(), gate.waiting) == (0, 0)
    with pytest.raises(RuntimeError):  # a slot given back twice is a bug, not a free slot
        gate.finished(False, now=1)


@pytest.mark.timeout(10)
def test_a_batch_past_its_latest_start_is_refused_on_arrival_or_when_its_turn_comes():
    gate = StartGate(general=1)
    assert gate.arrive(w("late", start_by=5.0), now=6.0) is Arrival.REFUSE
    assert gate.arrive(w("a"), now=6.0) is Arrival.START
    assert gate.arrive(w("b", start_by=7.0), now=6.0) is Arrival.WAIT
    assert gate.arrive(w("c", start_by=9.0), now=6.0) is Arrival.WAIT
    assert gate.arrive(w("d", start_by=7.5), now=6.0) is Arrival.WAIT
    nxt, refused = gate.finished(False, now=8.0)  # "b" can no longer end in time: skipped
    assert nxt.key == "c" and [r.key for r in refused] == ["b"]
    nxt, refused = gate.finished(False, now=8.0)
    assert nxt is None and [r.key for r in refused] == ["d"]
    gate.validate()
    assert gate.running() == 0
    # Exactly at its latest start it may still start.
    assert gate.arrive(w("edge", start_by=8.0), now=8.0) is Arrival.START


@pytest.mark.timeout(10)
def test_take_back_returns_every_waiting_batch_and_leaves_the_running_ones():
    gate = StartGate(general=1, reserved=1)
    assert gate.arrive(w("a"), now=0) is Arrival.START
    assert gate.arrive(w("b"), now=0) is Arrival.WAIT
    assert gate.arrive(w("u", reserved=True), now=0) is Arrival.START
    assert gate.arrive(w("v", reserved=True), now=0) is Arrival.WAIT
    assert [b.key for b in gate.take_back()] == ["b", "v"]
    gate.validate()
    assert (gate.running(), gate.running(True), gate.waiting) == (1, 1, 0)
    assert gate.finished(False, now=1) == (None, [])
    assert gate.finished(True, now=1) == (None, [])
    assert gate.take_back() == []


@pytest.mark.timeout(10)
def test_reserved_slots_are_their_own_a_general_batch_never_takes_one():
    gate = StartGate(general=1, reserved=1)
    assert gate.arrive(w("a"), now=0) is Arrival.START
    assert gate.arrive(w("b"), now=0) is Arrival.WAIT  # the reserved slot is free, not its kind
    assert gate.arrive(w("u", reserved=True), now=0) is Arrival.START
    assert gate.finished(True, now=0) == (None, [])
    assert gate.finished(False, now=0)[0].key == "b"
    gate.validate()


@pytest.mark.timeout(10)
def test_the_latest_start_is_where_the_walltime_guard_stops_saying_a_batch_fits():
    estimates = DurationEstimates(quantile=1.0, safety=1.0)
    guard = WalltimeGuard(leaves_at=100.0, estimates=estimates, margin_s=10.0)
    # Nothing measured: it may start until no time is left.
    assert guard.latest_start({"t": 3}) == 90.0
    estimates.observe(1, 2.0, ["t"])
    assert guard.latest_start({"t": 3}) == 84.0
    assert guard.fits(84.0, {"t": 3}) and not guard.fits(84.01, {"t": 3})
    assert guard.latest_start({"t": 3, "never seen": 1}) == 82.0  # counts as the slowest seen
