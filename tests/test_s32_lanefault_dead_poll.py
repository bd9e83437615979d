"""A consumer's worker is killed while the consumer's long poll (``get_batch``) waits in its
queue. Dask does not end a call whose caller died: the poll waits on in the queue, and the
lease that the queue takes back from that worker must not go to it (its answer goes nowhere,
and the lease would hold the message until it expires).

This is how ``test_lane.py::test_a_killed_consumer_worker_loses_no_message_waited_on_over_the_lane``
failed under load (1 s polls: whether the dead poll still waited when the loss was heard of
was chance); here the polls are long, so it always does.
"""

from __future__ import annotations

import pytest

from daskqueue import ConsumerPool, QueuePool
from tests import gate_tasks
from tests.helpers import kill_worker, wait_until


def _waiting_polls(client, queue_address: str) -> int:
    """How many ``get_batch`` calls wait in the queue actors of the worker at ``queue_address``."""
    def count(dask_worker):
        from daskqueue.queue.base import QueueActorBase

        return sum(a._getters for a in dask_worker.state.actors.values() if isinstance(a, QueueActorBase))

    return client.run(count, workers=[queue_address])[queue_address]


@pytest.mark.timeout(240)
def test_a_message_taken_back_from_a_killed_worker_does_not_go_to_its_dead_poll(cluster_factory, tmp_path):
    cluster, client = cluster_factory(3)
    qp = QueuePool(client, 1, lease_timeout_s=120)  # far longer than the wait: only the loss brings it back
    cp = ConsumerPool(client, qp, n_consumers=2, isolation="thread", idle_poll_s=60)
    cp.start()
    queue_address = qp.queues[0]._address
    consumers = cp.consumers
    k = next(i for i, c in enumerate(consumers) if c._address != queue_address)
    victim = consumers[k]._address
    for i, c in enumerate(consumers):
        if i != k:  # the victim's poll is then the only one in the queue when the message is back
            c.stop().result(timeout=30)
    # The task runs until the test releases it: the victim dies running it.
    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    task_id = qp.submit(gate_tasks.run_until_released, 7, started, release)
    wait_until(lambda: cp.stats()[k].inflight_items == 1, timeout_s=60, interval_s=0.05)
    # Running its task, the victim polls for the next batch (prefetch): that poll waits now.
    wait_until(lambda: _waiting_polls(client, queue_address) == 1, timeout_s=30, interval_s=0.05)
    kill_worker(client, victim)
    wait_until(lambda: qp.stats()[0].total_worker_lost == 1, timeout_s=60, interval_s=0.05)
    with open(release, "w"):
        pass
    assert cp.result(task_id, timeout=60) == 7  # run again by the consumer that replaces it
    stats = qp.stats()[0]
    assert stats.total_worker_lost == 1
    assert stats.total_expired == 0
    cp.close()
    qp.close()
