"""Races of ``remove_queue`` with the owner's own maps and polls, made deterministic by
delaying one client-side step (Dask stays real). On the shared cluster: no worker is lost
or added, a queue of the test's own pool is removed."""

from __future__ import annotations

import threading

import pytest

from daskqueue.queue.sending import Sender
from tests import tasks
from tests.helpers import wait_until


def pool_and_consumers(pools, n_queues=3, **kwargs):
    """A pool and its consumers, not started."""
    qp = pools.queue(n_queues, max_retries=0, **kwargs)
    return qp, pools.consumer(qp, n_consumers=2)


@pytest.mark.timeout(120)
def test_a_typed_maps_outcomes_moved_and_filed_before_its_claim_still_reach_it(pools, monkeypatch):
    # A typed map's put goes to its type's queue, which is then removed before the put's
    # answer is read: its messages move to another queue, run there, and their outcomes are
    # polled from that queue (which the map's send does not hold) before the map registers
    # its claim. They must reach the map, not results().
    # The consumers start once the messages moved: none runs at the removed queue.
    qp, cp = pool_and_consumers(pools, put_batch_size=20, scheduler="fair")
    victim = qp.router.route("a", None)
    stored = Sender._stored
    done = threading.Event()
    removed = {}

    def late_stored(self, q, *args, **kwargs):
        if q == victim and not done.is_set():
            done.set()
            removed["moved"] = qp.remove_queue(victim, timeout_s=60)
            cp.start()
            # The moved tasks run at their new queue; their outcomes are filed before the claim.
            wait_until(lambda: qp.poll_outcomes() >= 0 and len(qp.collector.results) == 20, timeout_s=60)
        return stored(self, q, *args, **kwargs)

    monkeypatch.setattr(Sender, "_stored", late_stored)
    monkeypatch.setattr(qp, "has_running_consumers", lambda: True)  # they start later
    out = qp.map(tasks.double, range(20), type="a", timeout_s=60)
    assert out == [2 * x for x in range(20)]
    assert removed["moved"] == 20 and victim not in qp.queue_indices
    assert qp.results() == {}


@pytest.mark.timeout(120)
def test_remove_queue_fetches_every_outcome_even_when_its_last_polls_answer_is_dropped(pools, monkeypatch):
    # Another poll's answer (read earlier: 20 outcomes) is applied while remove_queue's last
    # poll of the queue is in flight: that poll's answer, sent with the old cursors, is
    # dropped (see daskqueue.outcome_polls). The queue must not close with the 20 outcomes
    # that only the dropped answer carried.
    qp = pools.queue(2, max_retries=0)
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    collector = qp.collector
    victim = qp.router.route(None, "k")
    tasks_of = lambda xs: [(tasks.double, x) for x in xs]  # noqa: E731
    ids = qp.batch_submit(tasks_of(range(20)), key="k")  # more than a send primes a poll for
    wait_until(lambda: qp.queues[victim].stats().result(timeout=30).total_acked == 20, timeout_s=60)
    with collector.exclusive():
        older = collector._send(victim, 0.0)
    older_answer = collector._answer(victim, older.pending, None)  # read, not applied yet
    ids += qp.batch_submit(tasks_of(range(20, 40)), key="k")
    wait_until(lambda: qp.queues[victim].stats().result(timeout=30).total_acked == 40, timeout_s=60)
    answer = collector._answer
    applied = []

    def older_applied_first(q, pending, deadline):
        if q == victim and not applied:
            applied.append(collector._apply(older, older_answer))
        return answer(q, pending, deadline)

    monkeypatch.setattr(collector, "_answer", older_applied_first)
    qp.remove_queue(victim, timeout_s=60)
    assert applied == [20]
    assert qp.results() == {i: 2 * x for x, i in enumerate(ids)}


@pytest.mark.timeout(120)
def test_a_poll_that_finds_a_queue_closed_by_remove_queue_counts_it_as_empty(pools, monkeypatch):
    # A poll of every queue read the list of queues to ask; queue 1 is then removed (closed,
    # its actor released) before the poll's call to it is sent. A concurrent map or executor
    # would end with QueueClosedError; the queue's outcomes were fetched before it closed.
    qp = pools.queue(2, max_retries=0)
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    collector = qp.collector
    assert qp.map(tasks.double, range(4)) == [0, 2, 4, 6]
    send = collector._send
    removed = []

    def remove_first(q, wait_s):
        if q == 0 and not removed:
            # Queue 0 is asked first: remove queue 1 now (the poll holds no lock while it
            # sends: a send may wait for a moving queue meanwhile, as long as this removal).
            removed.append(qp.remove_queue(1, timeout_s=60))
        return send(q, wait_s)

    monkeypatch.setattr(collector, "_send", remove_first)
    assert collector.poll() == 0
    assert removed == [0] and qp.queue_indices == [0]
    assert qp.map(tasks.double, range(4)) == [0, 2, 4, 6]


@pytest.mark.timeout(10)
def test_moved_ids_forget_a_run_only_once_every_message_of_it_had_its_outcome():
    # At-least-once: the outcomes of the first half of a moved run arrive twice before the
    # second half's; the second half must still be reported under the ids it was given.
    from daskqueue.moved import MovedIds

    moves = MovedIds()
    moves.add([(100, 40, 1, 0)], 2)  # messages 100.. of queue 2 are 0.. of queue 1
    assert moves.pieces(1, 0, 20, settle=True) == [(2, 100, 20, 0)]
    assert moves.pieces(1, 0, 20, settle=True) == [(2, 100, 20, 0)]  # delivered again
    assert moves.pieces(1, 20, 20, settle=True) == [(2, 120, 20, 0)]
    assert not moves  # every message had its outcome: forgotten
    assert moves.pieces(1, 5, 1, settle=True) == [(1, 5, 1, 0)]  # once more: under its new id
