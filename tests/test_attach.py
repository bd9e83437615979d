"""More than one producer on one pool: a second client attached by name in another process,
mapping while the owner maps; closing an attached handle, and the owner closing the pool."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from daskqueue import ConfigurationError, ConsumerPool, QueuePool
from daskqueue.errors import PoolClosedError, QueueClosedError
from tests import tasks

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_a_second_client_in_another_process_maps_while_the_owner_maps_and_each_gets_exactly_its_own(
        client, pools):
    qp = pools.queue(2, name="attach-two-producers")
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    other = subprocess.Popen([sys.executable, "-m", "tests.attach_client", client.scheduler.address, qp.name],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    rounds = 0
    while other.poll() is None or rounds < 3:  # the owner maps the whole time the other runs
        start = 100 * rounds
        expected = [2 * x for x in range(start, start + 100)]
        assert qp.map(tasks.double, range(start, start + 100), timeout_s=60) == expected
        rounds += 1
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err.decode()[-3000:]
    got = json.loads(out)
    assert "attached handle" in got["repr"]
    assert got["map"] == [2 * x for x in range(10_000, 10_400)]
    assert got["result"] == [1, 2, 3, 4, 5]
    assert got["results"] == [1, 2, 3, 4, 5] and got["failures"] == 0  # none of the owner's
    assert qp.results() == {} and qp.failures() == {}  # and none of its in the owner's


@pytest.mark.timeout(60)
def test_closing_an_attached_handle_leaves_the_pool_open_and_the_owner_closing_it_is_a_typed_error(client, pools):
    qp = pools.queue(1, name="attach-close")
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "attach-close")
    other = qp.attach(client, "attach-close")  # the same, called on an instance
    assert attached.producer != other.producer != 0
    task = attached.submit(tasks.double, 21)
    assert attached.result(task, timeout_s=30) == 42
    attached.close()
    with pytest.raises(QueueClosedError):
        attached.submit(tasks.double, 1)
    assert qp.map(tasks.double, [1, 2]) == [2, 4]  # the pool stays open
    cp.close()
    qp.close()
    with pytest.raises(PoolClosedError):
        other.submit(tasks.double, 1)
    with pytest.raises(PoolClosedError):
        QueuePool.attach(client, "attach-close")


@pytest.mark.timeout(30)
def test_attaching_asks_for_a_client_and_an_open_pool(client):
    with pytest.raises(ConfigurationError):
        QueuePool.attach("not a client", "x")
    with pytest.raises(PoolClosedError, match="no open pool"):
        QueuePool.attach(client, "no-such-pool")


@pytest.mark.timeout(60)
def test_a_pool_pickles_as_a_handle_whose_outcomes_the_owner_reads(client, pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    handle = pickle.loads(pickle.dumps(qp))
    assert handle.name == qp.name and handle.producer == qp.producer == 0
    task = handle.submit(tasks.double, 4)
    assert qp.result(task, timeout_s=30) == 8
    with pytest.raises(ConfigurationError, match="read by whoever submitted"):
        handle.results()
    # Unpickled by Dask on a worker (a plain Dask task given the pool): a handle there too.
    from tests import nested_tasks

    task = client.submit(nested_tasks.submit_from_a_dask_task, qp, 7, pure=False).result(timeout=30)
    assert qp.result(task, timeout_s=30) == 49


@pytest.mark.timeout(90)
def test_an_attached_handle_follows_a_durable_queue_reopened_after_its_worker_died(cluster_factory, tmp_path):
    from tests.helpers import kill_worker

    _, client = cluster_factory(3)
    qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "q", name="attach-follow")
    cp = ConsumerPool(client, qp, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "attach-follow")
    assert attached.map(tasks.double, range(6), timeout_s=30) == [0, 2, 4, 6, 8, 10]
    kill_worker(client, qp.queues[0]._address)
    assert attached.map(tasks.double, range(6), timeout_s=60) == [0, 2, 4, 6, 8, 10]
    cp.close()
    qp.close()


@pytest.mark.timeout(60)
def test_an_attached_producer_gets_its_own_outcomes_from_early_acking_consumers_too(client, pools):
    qp = pools.queue(2, name="attach-early-ack")
    cp = pools.consumer(qp, early_ack=True, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "attach-early-ack")
    ids = qp.batch_submit([(tasks.double, i) for i in range(20)])
    assert attached.map(tasks.double, range(100, 130), timeout_s=30) == [2 * x for x in range(100, 130)]
    cp.join(timeout=30)
    assert sorted(cp.results().items()) == sorted((i, 2 * k) for k, i in enumerate(ids))
    attached.close()


@pytest.mark.timeout(10)
def test_a_closed_queue_of_a_pool_still_registered_is_a_removed_queue_not_a_closed_pool():
    import concurrent.futures

    from daskqueue.queue.attached import HandleTable
    from daskqueue.queue.table import Pending

    def closed_call():
        f = concurrent.futures.Future()
        f.set_exception(QueueClosedError("queue 1 is closed"))
        return Pending(f, object())

    table = HandleTable("transient", [object(), object()], [None, None], scheduler_lost=lambda: None,
                        settled=lambda q: 0)
    table.pool_name = "p"
    table.refresh = lambda q: (True, None)  # the owner's pool is registered; queue 1 is not listed
    with pytest.raises(QueueClosedError, match="removed") as caught:
        table.answer(1, closed_call())
    assert not isinstance(caught.value, PoolClosedError)
    table.refresh = lambda q: (False, None)  # the pool is gone from the registry
    with pytest.raises(PoolClosedError):
        table.answer(1, closed_call())


@pytest.mark.timeout(60)
def test_a_pool_of_an_asynchronous_client_pickles_in_its_event_loop(client):
    import asyncio

    from distributed import Client

    async def main():
        async with Client(client.scheduler.address, asynchronous=True) as aclient:
            qp = await QueuePool(aclient, 1)
            try:
                return pickle.dumps(qp)  # what await aclient.submit(f, qp) does
            finally:
                await qp.close_async()

    assert len(asyncio.run(main())) > 0


@pytest.mark.timeout(10)
def test_attach_refuses_an_asynchronous_client():
    from daskqueue.queue.attached import attach_by_name

    with pytest.raises(ConfigurationError, match="synchronous"):
        attach_by_name(type("AsyncClient", (), {"asynchronous": True})(), "p")


@pytest.mark.timeout(10)
def test_an_attached_handle_stops_routing_to_a_queue_it_finds_removed():
    import concurrent.futures

    from daskqueue.producers import ProducerSpec
    from daskqueue.queue.attached import build_handle
    from daskqueue.queue.config import PoolConfig
    from daskqueue.queue.table import Pending

    handle = build_handle(ProducerSpec("p", PoolConfig(), None, (None, None), 5), [object(), object()], None,
                          role="attached")
    handle.table.refresh = lambda q: (True, None)  # registered; queue 1 no longer listed
    closed = concurrent.futures.Future()
    closed.set_exception(QueueClosedError("queue 1 is closed"))
    with pytest.raises(QueueClosedError, match="removed"):
        handle.table.answer(1, Pending(closed, object()))
    assert handle.router.targets == [0] and 1 in handle.table.removed


@pytest.mark.timeout(90)
def test_an_attached_handle_calls_through_its_own_client_and_closes_its_lanes(client, pools):
    """Attached through a client that is not Dask's current one, the handle's queue calls go
    through that client (they went through the current one), and closing the handle closes
    its lane sockets (they were left for the garbage collector)."""
    from distributed import Client

    from tests.helpers import wait_until

    qp = pools.queue(1, name="attach-own-client")
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    with Client(client.scheduler.address, set_as_default=False, timeout=30) as other:
        attached = QueuePool.attach(other, "attach-own-client")
        handle = attached.queues[0]
        assert handle._client is other
        wait_until(lambda: attached.result(attached.submit(tasks.double, 2), timeout_s=30) == 4
                   and handle.lane_peer() is not None, timeout_s=30)
        attached.close()
        assert handle.lane_peer() is None
        assert qp.map(tasks.double, [1, 2]) == [2, 4]  # the pool serves on
