"""A pool made with an asynchronous client never uses the lane, also for the calls its
``*_async`` methods make on a thread (``asyncio.to_thread``), where Dask's
``Client.asynchronous`` reads False (no running loop in that thread)."""

from __future__ import annotations

import asyncio

import pytest
from distributed import Client

from daskqueue import ConsumerPool, QueuePool
from daskqueue.queue.lane import lane_allowed
from tests import tasks
from tests.helpers import wait_until


@pytest.mark.timeout(60)
def test_an_asynchronous_client_is_refused_the_lane_on_a_thread_too(client):
    async def main():
        async with Client(client.scheduler.address, asynchronous=True, set_as_default=False) as aclient:
            address = client.scheduler_info()["workers"].popitem()[0]
            return lane_allowed(aclient, address), await asyncio.to_thread(lane_allowed, aclient, address)

    in_loop, on_thread = asyncio.run(main())
    assert not in_loop and not on_thread


@pytest.mark.timeout(120)
def test_puts_of_an_asynchronous_client_on_a_thread_never_take_the_lane(client):
    """The flaky failure of test_lane's asynchronous-client test: ``batch_submit_async``
    runs ``batch_submit`` on a thread; its first put asked for the lane's endpoint, and a
    later put or poll on a thread (once the endpoint was known) connected."""
    async def main():
        async with Client(client.scheduler.address, asynchronous=True, set_as_default=False) as aclient:
            qp = await QueuePool(aclient, 1)
            cp = await ConsumerPool(aclient, qp, n_consumers=1, isolation="thread")
            try:
                await cp.start_async()
                handle = qp.queues[0]
                peers = []
                for i in range(6):
                    ids = await qp.batch_submit_async([(tasks.double, i)])
                    assert await qp.result_async(ids[0], 30) == 2 * i
                    peers.append(handle.lane_peer())
                    await asyncio.sleep(0.05)  # the endpoint's discovery (one Dask call) answers
                return peers
            finally:
                await cp.close_async()
                await qp.close_async()

    peers = asyncio.run(main())
    assert peers == [None] * 6


class _EchoPeer:
    """A lane peer by hand: accepts one connection, reads the hello, and answers each
    request when told to (``answer(rid)``), with an empty OK body pickled as None."""

    def __init__(self) -> None:
        import socket

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conn = None

    def accept(self):
        self.conn, _ = self.listener.accept()

    def answer(self, rid: int) -> None:
        import pickle

        from daskqueue.queue.lane_wire import OK, encode_reply

        self.conn.sendall(encode_reply(rid, OK, pickle.dumps(None)))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


@pytest.mark.timeout(30)
def test_done_looks_before_it_reads_and_still_sees_an_answer_and_a_lost_peer():
    import threading
    import time

    from daskqueue.queue.lane import LaneFuture
    from daskqueue.queue.lane_connection import LaneConnection
    from daskqueue.queue.lane_wire import SECRET_BYTES

    peer = _EchoPeer()
    accepting = threading.Thread(target=peer.accept)
    accepting.start()
    conn = LaneConnection("127.0.0.1", peer.port, b"s" * SECRET_BYTES, loss_timeout_s=0.3)
    accepting.join(10)
    redone = []
    try:
        rid = conn.send("fetch_outcomes", (0, 0, 0.0))
        future = LaneFuture(conn, rid, lambda: redone.append(1) or _Done())
        assert not conn.may_have(rid) and not future.done()  # nothing sent back yet
        peer.answer(rid)
        wait_until(lambda: future.done(), timeout_s=10)
        assert future.result(5) is None and not redone
        # A reply overdue (the peer never answers): done() takes the reader's path, which
        # finds the host lost and makes the call again through the fallback.
        rid2 = conn.send("fetch_outcomes", (0, 0, 0.0))
        lost = LaneFuture(conn, rid2, lambda: redone.append(2) or _Done())
        time.sleep(0.4)
        assert conn.may_have(rid2)
        assert lost.done() and redone == [2]
    finally:
        conn.close()
        peer.close()


class _Done:
    def done(self) -> bool:
        return True

    def result(self, timeout=None):
        return "redone"
