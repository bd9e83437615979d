"""The lane (``daskqueue/queue/lane.py``): a synchronous client's puts and outcome polls over
a socket of its own to the queue actor, and every way it falls back to Dask's calls."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time

import dask
import psutil
import pytest
from distributed import Client

from daskqueue import ConsumerPool, QueuePool
from daskqueue.errors import ConfigurationError, QueueClosedError, QueueLostError, RemoteTaskError, SerializationError
from daskqueue.queue.lane import lane_allowed
from daskqueue.queue.lane_wire import HEADER, HELLO, METHOD_CODES, SECRET_BYTES, decode_args, encode_request
from tests import gate_tasks, tasks
from tests.helpers import kill_worker, lane_servers, wait_until


def _lane_up(qp, cp, timeout_s: float = 30.0) -> tuple[str, int]:
    """Run single tasks until the pool's first queue handle uses its lane (found through
    one Dask call, so the first calls go through Dask); its ``(host, port)``."""
    wait_until(lambda: cp.result(qp.submit(tasks.double, 1), timeout=30) == 2 and qp.queues[0].lane_peer(),
               timeout_s=timeout_s)
    return qp.queues[0].lane_peer()


def _stop_lanes(client) -> None:
    """Stop every queue actor's lane on the workers (as its close does, the actor serving on)."""
    async def stop(dask_worker):
        for a in list(dask_worker.state.actors.values()):
            if hasattr(a, "_stop_lane"):
                await a._stop_lane()

    client.run(stop)


@pytest.mark.timeout(10)
def test_requests_carry_bytes_ints_floats_and_none_and_nothing_else():
    frame = encode_request(7, METHOD_CODES["fetch_outcomes"], (b"ab", -3, 0.25, None, 2**62))
    length, rid, code = HEADER.unpack_from(frame)
    assert (rid, code, length) == (7, METHOD_CODES["fetch_outcomes"], len(frame) - HEADER.size)
    assert decode_args(frame[HEADER.size:]) == (b"ab", -3, 0.25, None, 2**62)
    assert encode_request(1, 1, ({"a": 1},)) is None  # no pickle on the actor's side: Dask carries it
    assert encode_request(1, 1, (True,)) is None


@pytest.mark.timeout(10)
def test_the_lane_is_only_for_plain_tcp_without_required_encryption():
    class Sync:
        asynchronous = False
        security = None
        scheduler = type("rpc", (), {"address": "tcp://127.0.0.1:1"})()

    class Tls(Sync):
        security = type("Security", (), {"require_encryption": True})()

    class Async(Sync):
        asynchronous = True

    assert lane_allowed(Sync(), "tcp://127.0.0.1:2")
    assert not lane_allowed(Sync(), "tls://127.0.0.1:2")
    assert not lane_allowed(Sync(), "inproc://127.0.0.1/1/2")
    assert not lane_allowed(Tls(), "tcp://127.0.0.1:2")
    assert not lane_allowed(Async(), "tcp://127.0.0.1:2")
    with dask.config.set({"daskqueue.lane": False}):
        assert not lane_allowed(Sync(), "tcp://127.0.0.1:2")


@pytest.mark.timeout(120)
def test_single_tasks_go_over_the_lane_with_their_options_ids_and_errors(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=2, isolation="thread")
    cp.start()
    _lane_up(qp, cp)
    put_before = qp.stats()[0].total_put
    ids = [qp.submit(tasks.add, i, y=1, dq_priority=i % 3, dq_type="t") for i in range(20)]
    assert len(set(ids)) == 20
    assert [cp.result(i, timeout=30) for i in ids] == [i + 1 for i in range(20)]
    failed = qp.submit(tasks.boom, 5)
    with pytest.raises(RemoteTaskError, match="boom 5"):
        cp.result(failed, timeout=60)
    assert qp.queues[0].lane_peer() is not None  # still on the lane: nothing fell back
    assert qp.stats()[0].total_put - put_before == 21  # each stored once


@pytest.mark.timeout(120)
def test_a_bad_argument_or_a_closed_pool_raises_at_submit_with_the_lane_up(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    _lane_up(qp, cp)
    put_before = qp.stats()[0].total_put
    with pytest.raises(SerializationError):
        qp.submit(tasks.double, threading.Lock())
    with pytest.raises(ConfigurationError):
        qp.submit(tasks.double, 1, dq_delay_s=-1.0)
    assert qp.stats()[0].total_put == put_before
    qp.close()
    with pytest.raises(QueueClosedError):
        qp.submit(tasks.double, 1)


@pytest.mark.timeout(120)
def test_many_threads_share_one_lane(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=2, isolation="thread")
    cp.start()
    _lane_up(qp, cp)

    def run(k):
        return [cp.result(qp.submit(tasks.add, k, y=j), timeout=60) for j in range(15)]

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(run, range(8)))
    assert got == [[k + j for j in range(15)] for k in range(8)]
    assert qp.queues[0].lane_peer() is not None


@pytest.mark.timeout(120)
def test_a_maps_big_puts_go_over_the_lane_at_once_and_one_too_big_through_dask(pools, monkeypatch):
    from daskqueue.queue import actor_handles

    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    _lane_up(qp, cp)
    handle = qp.queues[0]
    through_dask = []
    real = type(handle)._call_through_dask

    def spy(self, key, args, kwargs):
        if key == "put_batch":
            through_dask.append(len(args[0]))
        return real(self, key, args, kwargs)

    monkeypatch.setattr(type(handle), "_call_through_dask", spy)
    sent = []
    real_send = handle._lane.connection().send

    def send(method, args, **kw):
        if method == "put_batch":
            sent.append((len(args[0]), kw.get("hold")))
        return real_send(method, args, **kw)

    monkeypatch.setattr(handle._lane.connection(), "send", send)
    blob = "x" * 200_000  # every put blob of this map is well over 64 KiB
    assert qp.map(tasks.length, [blob + str(i) for i in range(40)], timeout_s=60) == [200_000 + len(str(i)) for i in range(40)]
    assert through_dask == [] and sent and all(n > 64 * 1024 and not held for n, held in sent)
    monkeypatch.setattr(actor_handles, "LANE_MAX_PUT_BYTES", 64 * 1024)  # over the limit: Dask carries it
    assert qp.map(tasks.length, [blob], timeout_s=60) == [200_000]
    assert through_dask and through_dask[-1] > 64 * 1024


@pytest.mark.timeout(120)
def test_the_lane_can_be_turned_off_and_then_no_worker_listens_for_it(pools, client):
    with dask.config.set({"daskqueue.lane": False}):
        qp = pools.queue(1)
        cp = pools.consumer(qp, n_consumers=1, isolation="thread")
        cp.start()
        assert [cp.result(qp.submit(tasks.double, i), timeout=30) for i in range(10)] == [2 * i for i in range(10)]
        assert qp.queues[0].lane_peer() is None
        assert lane_servers(client) == 0


@pytest.mark.timeout(120)
def test_a_stranger_without_the_secret_is_cut_off_and_the_lane_serves_on(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    host, port = _lane_up(qp, cp)
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(HELLO + b"x" * SECRET_BYTES + encode_request(1, METHOD_CODES["fetch_outcomes"], (0, 0, 0.0)))
        assert s.recv(100) == b""  # closed, nothing answered
    assert cp.result(qp.submit(tasks.double, 21), timeout=30) == 42
    assert qp.queues[0].lane_peer() == (host, port)


@pytest.mark.timeout(120)
def test_an_actor_that_stops_its_lane_sends_calls_in_flight_through_dask_once(pools, client):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    _lane_up(qp, cp)
    put_before = qp.stats()[0].total_put
    task_id = qp.submit(tasks.sleep_then, 7, 0.5)  # its outcome poll waits on the lane now
    _stop_lanes(client)
    assert cp.result(task_id, timeout=60) == 7
    assert qp.queues[0].lane_peer() is None
    assert [cp.result(qp.submit(tasks.double, i), timeout=30) for i in range(5)] == [0, 2, 4, 6, 8]
    assert qp.stats()[0].total_put - put_before == 6


@pytest.mark.timeout(120)
def test_a_connection_cut_without_goodbye_sends_calls_in_flight_through_dask_once(pools, client):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    _lane_up(qp, cp)
    put_before = qp.stats()[0].total_put

    def cut(dask_worker):  # as a reset on the network would: no goodbye
        for a in dask_worker.state.actors.values():
            server = getattr(a, "_lane_server", None)
            for conn in list(server.connections) if server is not None else ():
                conn._transport.abort()

    task_id = qp.submit(tasks.sleep_then, 8, 0.5)  # its outcome poll waits on the lane now
    client.run(cut)
    assert cp.result(task_id, timeout=60) == 8
    assert [cp.result(qp.submit(tasks.double, i), timeout=30) for i in range(3)] == [0, 2, 4]
    assert qp.stats()[0].total_put - put_before == 4


@pytest.mark.timeout(120)
def test_closing_the_pool_closes_the_lane_on_both_sides(pools, client):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    host, port = _lane_up(qp, cp)

    def to_lane():
        return [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port]

    def listening(port=port):
        return [c for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port]

    assert len(to_lane()) == 1
    assert sum(map(len, client.run(listening).values())) == 1
    cp.close()
    qp.close()
    assert to_lane() == []
    wait_until(lambda: sum(map(len, client.run(listening).values())) == 0, timeout_s=10)


@pytest.mark.timeout(120)
def test_an_asynchronous_client_calls_through_dask(client):
    async def main():
        # set_as_default=False leaves the synchronous session client Dask's current one, as
        # in a notebook holding both: the pool's handles must still call through aclient.
        async with Client(client.scheduler.address, asynchronous=True, set_as_default=False) as aclient:
            qp = await QueuePool(aclient, 1)
            cp = await ConsumerPool(aclient, qp, n_consumers=1, isolation="thread")
            try:
                ids = await qp.batch_submit_async([(tasks.double, 1)])
                assert qp.queues[0]._client is aclient
                assert all(h._client is aclient for h in cp.consumers)  # not the session's
                # Read before join_async, whose blocking part runs on a thread: there the
                # client is not "asynchronous" and the lane may serve it.
                return ids, lane_allowed(aclient, qp.queues[0]._address), qp.queues[0].lane_peer()
            finally:
                await cp.close_async()
                await qp.close_async()

    ids, allowed, peer = asyncio.run(main())
    assert len(ids) == 1 and not allowed and peer is None


@pytest.mark.timeout(180)
def test_a_tls_cluster_calls_through_dask(cluster_factory):
    from distributed.security import Security

    cluster, client = cluster_factory(1, security=Security.temporary(), protocol="tls")
    with client.as_current():  # the handles bind the current client (the session's is plain tcp)
        _calls_through_dask_on_tls(client)


def _calls_through_dask_on_tls(client):
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp, n_consumers=1, isolation="thread")
    cp.start()
    try:
        assert qp.queues[0]._address.startswith("tls://")
        assert [cp.result(qp.submit(tasks.double, i), timeout=30) for i in range(5)] == [0, 2, 4, 6, 8]
        assert qp.queues[0].lane_peer() is None
        assert lane_servers(client) == 0
    finally:
        cp.close()
        qp.close()


@pytest.mark.timeout(180)
def test_a_killed_queue_worker_ends_a_wait_on_the_lane_with_queue_lost_in_bounded_time(cluster_factory):
    cluster, client = cluster_factory(2)
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp, n_consumers=2, isolation="thread")
    cp.start()
    _lane_up(qp, cp)
    task_id = qp.submit(tasks.sleep_then, 1, 120)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        waiting = ex.submit(cp.result, task_id)
        time.sleep(0.5)  # waiting on the lane (no condition to watch: the wait is the call)
        assert not waiting.done()
        started = time.monotonic()
        kill_worker(client, qp.queues[0]._address)
        with pytest.raises(QueueLostError):
            waiting.result(timeout=60)
        assert time.monotonic() - started < 30


@pytest.mark.timeout(240)
def test_a_killed_consumer_worker_loses_no_message_waited_on_over_the_lane(cluster_factory, tmp_path):
    cluster, client = cluster_factory(3)
    qp = QueuePool(client, 1, lease_timeout_s=120)
    cp = ConsumerPool(client, qp, n_consumers=3, isolation="thread")
    cp.start()
    _lane_up(qp, cp)
    queue_address = qp.queues[0]._address
    # The tasks run until the test releases them: the victim's one is running when it dies.
    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    ids = [qp.submit(gate_tasks.run_until_released, i, started, release) for i in range(3)]
    holders: list[str] = []

    def held_elsewhere() -> bool:
        # The victim holds a task, on a worker without the queue: the consumer next to the
        # queue often fetches two (one running, one prefetched), and another none.
        consumers, stats = cp.consumers, cp.stats()
        holders[:] = [c._address for c, s in zip(consumers, stats)
                      if s.inflight_items and c._address != queue_address]
        return sum(s.inflight_items for s in stats) == 3 and bool(holders)

    wait_until(held_elsewhere, timeout_s=60, interval_s=0.05)
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        waiting = [ex.submit(cp.result, i, 90) for i in ids]
        kill_worker(client, holders[0])
        # Its lease was taken back at the loss (not at expiry, 120 s), while the tasks ran.
        wait_until(lambda: qp.stats()[0].total_worker_lost >= 1, timeout_s=60, interval_s=0.05)
        with open(release, "w"):
            pass
        assert [w.result(timeout=120) for w in waiting] == [0, 1, 2]
    assert qp.stats()[0].total_put >= 3 + 1
    assert qp.queues[0].lane_peer() is not None  # the queue's worker lives: still on the lane
    cp.close()
    qp.close()


@pytest.mark.timeout(120)
def test_closing_the_pool_ends_a_wait_on_the_lane_at_once(pools):
    from daskqueue.errors import DaskQueueError

    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    _lane_up(qp, cp)
    task_id = qp.submit(tasks.sleep_then, 1, 3)  # still running at the close; short, as the pools' teardown waits for it
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        waiting = ex.submit(cp.result, task_id)
        time.sleep(0.3)  # waiting on the lane (no condition to watch: the wait is the call)
        started = time.monotonic()
        qp.close()
        with pytest.raises(DaskQueueError):
            waiting.result(timeout=30)
        assert time.monotonic() - started < 10


@pytest.mark.timeout(120)
def test_a_forked_child_never_uses_its_parents_lane(pools):
    import os

    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    peer = _lane_up(qp, cp)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: look, answer, leave without running any cleanup
        try:
            os.write(w, b"1" if qp.queues[0].lane_peer() is None else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert cp.result(qp.submit(tasks.double, 4), timeout=30) == 8
    assert qp.queues[0].lane_peer() == peer
