"""A call sent to a queue's actor just before the queue moved can reach the old worker after
the pool freed the old actor (on a busy connection, a new socket is opened for it). Nothing
of it ran: the pool must ask the queue where it is now, not raise ``QueueClosedError``.

The SLURM walltime test failed 2 runs in 5 this way: an outcome poll of a ``map`` raised
"TransientQueue-... is no longer on its worker ...: released". Here the late call is made
on purpose, through the old handle, once its worker has dropped the actor."""

from __future__ import annotations

import time

import pytest

from daskqueue.errors import QueueClosedError, QueueHandedOffError
from daskqueue.outcome_polls import _Fetch
from daskqueue.queue.table import Pending
from tests import tasks
from tests.helpers import wait_until


def _holds(client, handle) -> bool:
    key = handle.key
    held = client.run(lambda dask_worker: key in dask_worker.state.actors, workers=[handle._address])
    return bool(held.get(handle._address))


def _moved_and_released(client, qp):
    """Move queue 0 off its worker as a retirement does, and wait until the old worker has
    dropped the old actor; the old handle."""
    old = qp.queues[0]
    qp.follower.hand_off(0)
    assert qp.queues[0]._address != old._address
    wait_until(lambda: not _holds(client, old), timeout_s=30)
    # Calls through it from now on stand for calls made before the move that arrive only
    # now: the handle's own hold on the key (released with the actor) is not looked at.
    old.__dict__["_future"] = None
    return old


@pytest.mark.timeout(120)
def test_an_outcome_poll_that_reaches_the_freed_actor_asks_the_successor(client, pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    ids = qp.batch_submit([(tasks.double, i) for i in range(20)])
    cp.join(timeout=60)
    old = _moved_and_released(client, qp)

    collector = qp.collector
    for wait_s in (30.0, 0.0):  # a primed long poll (read with a bound) and a short one
        args = (0, 0, wait_s)
        stale = _Fetch(0, Pending(old.fetch_outcomes(*args), old, "fetch_outcomes", args), (0, 0), wait_s,
                       time.monotonic())
        with collector._lock:
            collector._long[0] = stale
        collector.poll(wait_s=0.5)  # before: QueueClosedError "... is no longer on its worker"
        assert 0 not in collector._long or collector._long[0] is not stale

    results = cp.results()
    assert [results[i] for i in ids] == [2 * i for i in range(20)]
    assert qp.map(tasks.double, [21]) == [42]


@pytest.mark.timeout(120)
def test_a_call_that_reaches_the_freed_actor_is_a_hand_off_and_is_asked_again(client, pools):
    qp = pools.queue(1)
    old = _moved_and_released(client, qp)
    table = qp.table

    with pytest.raises(QueueHandedOffError):
        table.answer(0, Pending(old.stats(), old, "stats", ()))
    asked_again = table.answer_or_ask_again(0, Pending(old.stats(), old, "stats", ()))
    assert asked_again.index == 0

    # The same released actor of a queue that did not move (its pool removed or closed it)
    # stays "closed": the table must not send such a call anywhere else.
    table.handles[0], current = old, table.handles[0]
    try:
        with pytest.raises(QueueClosedError) as e:
            table.answer(0, Pending(old.stats(), old, "stats", ()))
        assert not isinstance(e.value, QueueHandedOffError)
    finally:
        table.handles[0] = current


@pytest.mark.timeout(60)
def test_a_long_poll_waited_on_while_its_transient_queue_hands_off_is_not_lost(client, pools):
    """A wait slice that ends after a hand-off began (``begin_move``, its first step) but
    before the old actor answers: the queue is moving, not lost. Before: QueueLostError
    ("lost with its worker ... transient messages are lost"), which ended a stream."""
    qp = pools.queue(1)
    table, collector = qp.table, qp.collector
    with collector._lock:
        collector._long[0] = collector._send(0, 30.0)
    table.begin_move(0)
    try:
        assert collector.poll(wait_s=0.2) == 0
    finally:
        table.end_move(0)


@pytest.mark.timeout(120)
def test_a_call_through_the_schedulers_proxy_to_the_freed_actor_is_a_hand_off(client, pools):
    """Through Dask's proxy (``direct_to_workers=False``, or a login node's fallback), a call
    that reaches a released actor is never answered: the table must not wait for it, nor
    call the queue lost."""
    qp = pools.queue(1, direct_to_workers=False)
    old = _moved_and_released(client, qp)
    with pytest.raises(QueueHandedOffError):
        qp.table.answer(0, Pending(old.stats(), old, "stats", ()))
    assert qp.table.answer_or_ask_again(0, Pending(old.stats(), old, "stats", ())).index == 0
