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
            remover = threading.Thread(target=lambda: removed.setdefault("moved", qp.remove_queue(victim, timeout_s=60)))
            remover.start()
            remover.join(timeout=90)
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
