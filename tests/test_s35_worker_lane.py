"""Calls from a worker to a queue actor on another worker go through the actor's lane
(``daskqueue/queue/worker_lane.py``): a consumer's fetches and settles, a queue's work
announcements. A Dask actor call between workers cost ~2.3 ms of CPU (both sides) and 1.5-4.5
ms of wall here, a lane call ~0.3 ms: measured in ``benchmarks/README.md`` (stop 35).

These check that the lane is taken where it should be, refused where the pool's client
turned lanes off, that a call whose arguments the wire cannot carry goes through Dask, and
that a queue worker killed under a consumer's long poll on the lane ends the poll in bounded
time with nothing lost. The fault tests of the rest of the suite run through it too
(consumers steal from the other workers' queues).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import dask
import pytest

from daskqueue import ConsumerPool, QueuePool
from daskqueue.queue import worker_lane
from daskqueue.queue.lane_server import LaneServer
from daskqueue.queue.lane_wire import (
    CLIENT_METHODS, HEADER, METHOD_CODES, WORKER_METHODS, LaneProtocolError, decode_args, encode_request,
)
from tests import tasks
from tests.helpers import kill_worker, lane_servers, wait_until


@pytest.mark.timeout(10)
def test_the_wire_carries_strs_for_the_workers_calls_and_refuses_a_broken_one():
    args = (500, 0.5, "tcp://127.0.0.1:4711", None, -(2**40), b"\x00\xff", "é")
    frame = encode_request(3, METHOD_CODES["get_batch"], args)
    assert decode_args(frame[HEADER.size:]) == args
    broken = b"s" + (3).to_bytes(4, "little") + b"\xff\xfe\xfd"
    with pytest.raises(LaneProtocolError):
        decode_args(broken)
    with pytest.raises(LaneProtocolError):
        decode_args(b"s" + (9).to_bytes(4, "little") + b"ab")  # runs past its frame
    # a client's lane carries its own two methods only: never a fetch or a settle
    assert CLIENT_METHODS == {"put_batch", "fetch_outcomes"}
    assert not CLIENT_METHODS & WORKER_METHODS and WORKER_METHODS <= set(METHOD_CODES)


def _lanes_to(client, worker: str, key: str) -> list[str]:
    """The worker lanes ``worker`` holds to the actor ``key`` (their states)."""
    def states(dask_worker, key=key):
        return ["open" if v.broken is None else "broken" for (_, k, _), v in worker_lane._lanes.items()
                if k == key and isinstance(v, worker_lane._Lane)]

    return client.run(states, workers=[worker])[worker]


@pytest.mark.timeout(120)
def test_a_consumer_on_another_worker_fetches_and_settles_through_the_queues_lane(cluster_factory):
    cluster, client = cluster_factory(2)
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp, isolation="thread")  # one per worker: one of them remote
    try:
        cp.start()
        home = qp.queues[0]._address
        (other,) = set(client.scheduler_info(n_workers=-1)["workers"]) - {home}
        assert qp.map(tasks.double, range(3000)) == [2 * x for x in range(3000)]
        # the consumer on the other worker called the queue through its lane (opened on its
        # first fetch), and kept it
        assert _lanes_to(client, other, qp.queues[0].key) == ["open"]
    finally:
        cp.close()
        qp.close()


@pytest.mark.timeout(120)
def test_with_lanes_turned_off_by_the_pools_client_workers_call_each_other_through_dask(cluster_factory):
    cluster, client = cluster_factory(2)
    with dask.config.set({"daskqueue.lane": False}):
        qp = QueuePool(client, 1)
        cp = ConsumerPool(client, qp, isolation="thread")
    try:
        cp.start()
        assert qp.map(tasks.double, range(2000)) == [2 * x for x in range(2000)]
        assert lane_servers(client) == 0
    finally:
        cp.close()
        qp.close()


@pytest.mark.timeout(120)
def test_a_typed_pools_fetch_whose_sizes_the_wire_cannot_carry_goes_through_dask(cluster_factory):
    cluster, client = cluster_factory(2)
    qp = QueuePool(client, 1, scheduler="fair")
    cp = ConsumerPool(client, qp, isolation="thread")
    try:
        cp.start()
        ids = [qp.submit(tasks.double, i, dq_type="a" if i % 2 else "b") for i in range(400)]
        assert [cp.result(i, timeout=60) for i in ids] == [2 * i for i in range(400)]
    finally:
        cp.close()
        qp.close()


@pytest.mark.timeout(180)
def test_a_queue_worker_killed_under_a_long_poll_on_the_lane_loses_nothing(cluster_factory, tmp_path):
    cluster, client = cluster_factory(2)
    qp = QueuePool(client, 1, durability="durable", dirpath=tmp_path / "pool")
    cp = ConsumerPool(client, qp, isolation="thread")
    try:
        cp.start()
        assert qp.map(tasks.double, range(200)) == [2 * x for x in range(200)]
        home = qp.queues[0]._address
        (other,) = set(client.scheduler_info(n_workers=-1)["workers"]) - {home}
        wait_until(lambda: _lanes_to(client, other, qp.queues[0].key) == ["open"], timeout_s=30)
        kill_worker(client, home)  # the remote consumer's long poll was waiting on the lane
        # the queue is reopened (on the worker left, or the restarted one) and serves on
        assert qp.map(tasks.double, range(300), timeout_s=120) == [2 * x for x in range(300)]
    finally:
        cp.close()
        qp.close()


@pytest.mark.timeout(10)
def test_the_entries_of_actors_called_through_dask_stay_bounded(fresh_lanes):
    async def no_endpoint(method, args):
        assert method == "lane_endpoint"
        return None  # an actor that serves no lane

    async def main():
        for i in range(3 * worker_lane.MAX_ENTRIES):
            assert await worker_lane._lane_of(SimpleNamespace(key=f"q-{i}", _address=_ADDRESS), no_endpoint) is None
        return len(worker_lane._lanes)

    assert asyncio.run(main()) <= worker_lane.MAX_ENTRIES + 1


#: The actor the two tests below serve, as a WorkerActor handle names it (what lane_call reads).
_KEY, _ADDRESS = "queue-x", "tcp://127.0.0.1:9"
_HANDLE = SimpleNamespace(key=_KEY, _address=_ADDRESS)


async def _serving(actor) -> LaneServer:
    """A real lane server of ``actor`` on loopback, its worker a stand-in that holds it."""
    worker = SimpleNamespace(address=_ADDRESS, state=SimpleNamespace(actors={_KEY: actor}))
    server = LaneServer(actor, _KEY, worker)
    await server.start("127.0.0.1")
    return server


@pytest.fixture
def fresh_lanes():
    yield
    worker_lane.forget_lanes()


@pytest.mark.timeout(30)
def test_a_call_unanswered_at_the_actors_goodbye_goes_through_dask_once_and_a_late_one_is_not_run(fresh_lanes):
    """The actor closes its lane with a request of a worker on the wire: the server answers it
    FALLBACK unrun (or never reads it), the goodbye follows, and the caller makes it through
    Dask: made once in all. A request running when the close starts answers first."""

    class Actor:
        def __init__(self):
            self.ran = []
            self.release = asyncio.Event()

        async def work_at(self, *args):
            self.ran.append(args)
            if args[0] == 1:
                await self.release.wait()  # under way when the close starts
            return args[0]

    async def main():
        actor = Actor()
        server = await _serving(actor)
        through_dask = []

        async def dask_call(method, args):
            if method == "lane_endpoint":
                return server.endpoint
            through_dask.append(args)
            return ("dask", args[0])

        running = asyncio.ensure_future(worker_lane.lane_call(_HANDLE, "work_at", (1, None, 0, 0), dask_call))
        while not actor.ran:
            await asyncio.sleep(0.01)
        closing = asyncio.ensure_future(server.close())
        await asyncio.sleep(0.05)
        late = await worker_lane.lane_call(_HANDLE, "work_at", (2, None, 0, 0), dask_call)
        actor.release.set()
        await closing
        return await running, late, actor.ran, through_dask

    first, late, ran, through_dask = asyncio.run(main())
    assert first == 1  # under way at the close: answered on the lane before the goodbye
    assert late == ("dask", 2) and through_dask == [(2, None, 0, 0)]
    assert ran == [(1, None, 0, 0)]  # the late one never ran on the lane


@pytest.mark.timeout(30)
def test_an_actor_whose_lane_failed_is_called_through_dask_a_while_then_by_lane_again(monkeypatch, fresh_lanes):
    """As after a hand-off called off (the actor stopped its lane, then serves again): its
    calls go through Dask for LANE_RETRY_S, then the lane is asked for again."""
    monkeypatch.setattr(worker_lane, "LANE_RETRY_S", 0.3)

    class Actor:
        async def work_at(self, *args):
            return "lane"

    async def main():
        actor = Actor()
        servers = [await _serving(actor)]

        async def dask_call(method, args):
            return servers[-1].endpoint if method == "lane_endpoint" else "dask"

        async def call():
            return await worker_lane.lane_call(_HANDLE, "work_at", (1, None, 0, 0), dask_call)

        got = [await call()]
        await servers[0].close()  # its lane stops (goodbye)
        await asyncio.sleep(0.05)
        got.append(await call())  # the lane is gone: through Dask
        servers.append(await _serving(actor))  # it serves again
        got.append(await call())  # still within LANE_RETRY_S: Dask
        await asyncio.sleep(0.35)
        got.append(await call())  # asked again: by lane
        await servers[1].close()
        return got

    assert asyncio.run(main()) == ["lane", "dask", "dask", "lane"]
