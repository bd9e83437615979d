"""Attached producers while the owner removes a queue: outcomes recorded after the removed
queue handed on their records still reach them, exactly once; and closing an attached
handle lets go of the actors' keys at once. On the shared cluster; the moment of the late
put is chosen by a patched step of ``remove_queue`` (Dask itself stays real)."""

from __future__ import annotations

import pytest

from daskqueue import QueuePool
from daskqueue.messages import split_id
from daskqueue.queue import resize
from tests import tasks
from tests.helpers import wait_until


def _stats(qp, q):
    return [s for s in qp.stats() if s.index == q][0]


@pytest.mark.timeout(180)
def test_an_attached_producers_outcomes_recorded_after_the_hand_on_reach_it_exactly_once(client, pools, monkeypatch):
    # Queue 1 is drained and has handed its attached producers' records on; just then a put of
    # the attached producer reaches it (sent before the producer saw it draining), runs and is
    # acked, before the queue closes. Those outcomes must be handed on too (they were closed
    # away: the producer waited for them in vain). No poll of the producer's runs meanwhile
    # (one would fetch them before the close): a map's outcomes, unread at that moment, are
    # recorded the same way.
    qp = pools.queue(2, name="fixes4-late-records")
    cp = pools.consumer(qp, n_consumers=2, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "fixes4-late-records")
    early = attached.batch_submit([(tasks.double, i) for i in range(100, 140)])  # some records to hand on
    wait_until(lambda: sum(s.pending for s in qp.stats()) == 0, timeout_s=30)
    forward = resize.forward_records
    late: dict = {}

    def forward_then_a_late_put(pool, q, nodes):
        handed = forward(pool, q, nodes)
        if not late:
            targets, follow = list(attached.router.targets), attached.collector.follow
            attached.collector.follow = lambda: False  # it has not read the registry yet
            attached.router.route_to([q])
            acked = _stats(qp, q).total_acked
            try:  # over 16 tasks: no outcome poll starts with the put, nothing reads them before the close
                late["ids"] = attached.batch_submit([(tasks.double, i) for i in range(40)])
            finally:
                attached.router.route_to(targets)
                attached.collector.follow = follow
            wait_until(lambda: _stats(qp, q).total_acked >= acked + 40, timeout_s=30)  # ran, outcomes stored
        return handed

    monkeypatch.setattr(resize, "forward_records", forward_then_a_late_put)
    qp.remove_queue(1, timeout_s=90)
    assert {split_id(i)[0] for i in late["ids"]} == {1}
    assert [attached.result(i, timeout_s=20) for i in late["ids"]] == [2 * i for i in range(40)]
    assert [attached.result(i, timeout_s=20) for i in early] == [2 * i for i in range(100, 140)]
    assert sorted(attached.results()) == sorted(early + late["ids"])  # each once, none of another's
    assert not set(qp.results()) & set(late["ids"] + early)
    attached.close()


@pytest.mark.timeout(90)
def test_an_attached_handle_holds_no_reference_on_the_queue_actors(client, pools):
    # The actors are the owner's to free. Once, each of the handle's actor handles held a
    # future on the actor's key (until close, or until the garbage collector took the
    # handle): a queue that moved off a retiring worker kept its old actor there, and Dask
    # refused to retire the worker (tests/test_s33_attached_retire.py).
    qp = pools.queue(2, name="fixes4-attach-release")
    keys = [h.key for h in qp.table.handles]
    before = {k: client.refcount.get(k, 0) for k in keys}
    attached = QueuePool.attach(client, "fixes4-attach-release")
    assert len(attached.batch_submit([(tasks.double, i) for i in range(10)])) == 10  # used
    assert all(getattr(h, "_future", None) is None for h in attached.table.handles)
    assert {k: client.refcount.get(k, 0) for k in keys} == before
    attached.close()
    assert {k: client.refcount.get(k, 0) for k in keys} == before
    assert attached.queues[0] is not None  # the handle itself is still referenced here
