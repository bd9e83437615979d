"""The lane's waits, held puts and server-side loss detection, against peers under the
test's control: another thread's reply read by the reader wakes its waiter at once; a put
held back falls due when written, not when held; the actor's side closes a connection that
never says hello and watches its peers as the client's side does."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import dask
import pytest

from daskqueue.queue.lane_connection import LaneConnection
from daskqueue.queue.lane_server import LaneServer
from daskqueue.queue.lane_wire import HEADER, HELLO, OK, SECRET_BYTES, encode_reply
from tests.helpers import wait_until


class _ScriptedPeer:
    """Accepts one connection, reads the hello and request frames, and answers request
    ``k`` (in arrival order) at once, or once ``held[k]`` (an event) is set."""

    def __init__(self, held: dict[int, threading.Event] | None = None) -> None:
        self.held = held or {}
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.arrived: list[tuple[int, float]] = []  # (rid, when)
        self._conn: socket.socket | None = None
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self._conn = conn
        buf = bytearray()
        hello = len(HELLO) + SECRET_BYTES
        while True:
            data = conn.recv(1 << 16)
            if not data:
                return
            buf += data
            if hello:
                if len(buf) < hello:
                    continue
                del buf[:hello]
                hello = 0
            while len(buf) >= HEADER.size:
                length, rid, _ = HEADER.unpack_from(buf)
                if len(buf) < HEADER.size + length:
                    break
                del buf[: HEADER.size + length]
                k = len(self.arrived)
                self.arrived.append((rid, time.monotonic()))
                threading.Thread(target=self._reply, args=(conn, rid, self.held.get(k)), daemon=True).start()

    @staticmethod
    def _reply(conn: socket.socket, rid: int, held: threading.Event | None) -> None:
        if held is not None:
            held.wait(30)
        conn.sendall(encode_reply(rid, OK, b"\x80\x05N."))

    def close(self) -> None:
        self.listener.close()
        if self._conn is not None:
            self._conn.close()


#: How long the waiter below may wait: far longer than a filed reply takes to wake it.
WAIT_S = 10.0


@pytest.mark.timeout(30)
def test_a_reply_read_for_another_thread_wakes_it_while_the_reader_still_waits():
    late = threading.Event()
    peer = _ScriptedPeer({0: late})  # the first request (a long poll) is answered when the test says
    conn = LaneConnection("127.0.0.1", peer.port, b"s" * SECRET_BYTES, loss_timeout_s=30)
    try:
        slow = conn.send("fetch_outcomes", (b"", 0, 10.0), wait_s=10.0)
        reader = threading.Thread(target=conn.wait, args=(slow, None), daemon=True)
        reader.start()
        wait_until(lambda: conn._reading, timeout_s=10)  # the reader, waiting on the slow reply
        quick = conn.send("put_batch", (b"x",))
        # Its reply comes at once, read by the other thread, while the reader's own reply is
        # held back: a waiter not woken when its reply is filed sleeps to its deadline.
        started = time.monotonic()
        conn.wait(quick, started + WAIT_S)
        assert time.monotonic() - started < WAIT_S / 2, "woken only when its wait ran out"
        assert reader.is_alive()  # still reading: the slow reply is still held
        late.set()
        reader.join(10)
        assert not reader.is_alive()
    finally:
        late.set()
        conn.close()
        peer.close()


@pytest.mark.timeout(30)
def test_a_held_put_falls_due_when_it_is_written_not_when_it_was_held():
    peer = _ScriptedPeer()
    conn = LaneConnection("127.0.0.1", peer.port, b"s" * SECRET_BYTES, loss_timeout_s=0.5)
    try:
        held = conn.send("put_batch", (b"x",), hold=True)
        time.sleep(1.0)  # longer than the loss timeout, before anything is written
        assert peer.arrived == []
        poll = conn.send("fetch_outcomes", (b"", 0, 0.0))  # writes the held put with it
        conn.wait(held, time.monotonic() + 5)
        conn.wait(poll, time.monotonic() + 5)
        assert conn.broken is None and [r for r, _ in peer.arrived] == [held, poll]
    finally:
        conn.close()
        peer.close()


@pytest.mark.timeout(30)
def test_the_actors_side_closes_a_silent_connection_and_watches_its_peers():
    async def main():
        with dask.config.set({"distributed.comm.timeouts.tcp": "1s"}):
            server = LaneServer(actor=None, key="q", worker=None)
        await server.start("127.0.0.1")
        host, port, _ = server.endpoint
        reader, writer = await asyncio.open_connection(host, port)
        await asyncio.sleep(0.2)
        (conn,) = server.connections
        sock = conn._transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        closed = await asyncio.wait_for(reader.read(), 10)  # no hello sent: closed after ~1 s
        assert closed == b"" and not server.connections
        writer.close()
        await server.close()

    asyncio.run(main())
