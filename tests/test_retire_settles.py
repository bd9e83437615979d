"""A graceful retirement reruns nothing: a consumer elsewhere that still holds leases of a
queue on the retiring worker settles them at the queue's successor, however late it learns
where the queue went. Real ``LocalCluster``s and a real ``retire_workers``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from daskqueue import ConsumerPool, QueuePool
from daskqueue.consumer.calls import QueueCalls
from daskqueue.consumer.general import GeneralConsumer
from daskqueue.queue.handles import free_actor, queue_ref
from tests import tasks
from tests.helpers import wait_until

#: How long after the pool says so a ``HearsLate`` consumer learns that a queue moved.
HEAR_LATE_S = 4.0

#: How long each task runs: a consumer holds a batch fetched ahead (not started) while the
#: one before it runs, so it settles a lease of the old queue about two tasks after the
#: retirement began, after the old queue's worker could have left.
TASK_S = 3.0


class HearsLate(GeneralConsumer):
    """A consumer whose worker is slow to hear that a queue moved (a busy event loop, a
    slow network): the pool's ``set_queue`` takes effect ``HEAR_LATE_S`` after it is sent."""

    async def set_queue(self, queue_index: int, handle: Any) -> None:
        await asyncio.sleep(HEAR_LATE_S)
        await super().set_queue(queue_index, handle)


def _runs(log: str) -> list[int]:
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [int(line.split()[0]) for line in f.read().splitlines()]


@pytest.mark.timeout(180)
def test_leases_fetched_ahead_of_a_retired_queue_are_settled_at_its_successor(cluster_factory, tmp_path):
    cluster, client = cluster_factory(3)
    qp = QueuePool(client, 1)  # one queue: every consumer holds leases of the queue that moves
    cp = ConsumerPool(client, qp, HearsLate, batch_size=1, isolation="thread")
    cp.start()
    log = str(tmp_path / "runs.log")
    ids = qp.batch_submit([(tasks.logged_sleep, i, TASK_S, log) for i in range(8)])
    victim = qp.queues[0]._address
    # Each of the 3 consumers runs one task and holds one fetched ahead.
    wait_until(lambda: qp.stats()[0].leased >= 6, timeout_s=60)

    retired = client.retire_workers([victim])

    assert list(retired) == [victim]
    assert qp.queues[0]._address != victim
    cp.join(timeout=120)
    results = cp.results()
    assert [results[i] for i in ids] == list(range(8))
    assert cp.failures() == {}
    # The settlement of a task that ran must reach the queue wherever it went: a lost
    # settlement lets the lease expire at the successor, which runs the task again.
    assert sorted(_runs(log)) == list(range(8))
    assert all(s.total_retried == 0 and s.total_worker_lost == 0 for s in qp.stats())
    cp.close()
    qp.close()


class Named:
    """A tiny actor standing in for a queue: answers ``stats`` with its name."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def stats(self) -> str:
        return self.name


async def _settle_while_told_of_the_move(old_ref: Any, new_ref: Any) -> str:
    """On a worker: a consumer's call goes to the old actor, and the pool's word of the move
    arrives before its answer does."""
    calls = QueueCalls({0: old_ref})
    calls.bind()
    call = asyncio.ensure_future(calls.call_moving(0, "stats"))
    await asyncio.sleep(0)  # the call is made with the old handle
    calls.move(0, new_ref)
    return await call


@pytest.mark.timeout(120)
def test_a_call_that_reaches_a_freed_actor_after_the_move_is_made_again_at_the_successor(client):
    """On the session's cluster: it kills and retires nothing."""
    # Asked of the scheduler directly: ``client.scheduler_info()`` may answer from a cache
    # that the client's periodic refresh leaves without workers.
    here, there = sorted(client.sync(client.scheduler.identity, n_workers=-1)["workers"])
    old = client.submit(Named, "old", actor=True, workers=[here])
    new = client.submit(Named, "new", actor=True, workers=[there])
    old_handle, new_handle = old.result(), new.result()
    old_ref, new_ref = queue_ref(old_handle), queue_ref(new_handle)
    free_actor(old, old_handle)  # as the pool frees a queue's old actor after a hand-off
    del old, old_handle
    key = old_ref[2]
    wait_until(lambda: not any(client.run(lambda dask_worker: key in dask_worker.state.actors).values()))

    answer = client.submit(_settle_while_told_of_the_move, old_ref, new_ref, workers=[there], pure=False)

    assert answer.result(timeout=60) == "new"
