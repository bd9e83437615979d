"""The lane detects a lost peer (issue 24, lat3): socket options for the kernel's
detection, and a peer that accepts and never answers ends a wait without deadline in
bounded time, the call then made again through the fallback (Dask in real use)."""

from __future__ import annotations

import concurrent.futures
import socket
import sys
import threading
import time

import pytest

from daskqueue.queue.lane import LaneClient, LaneFuture
from daskqueue.queue.lane_connection import KEEPALIVE_PROBES, LaneBroken, LaneConnection
from daskqueue.queue.lane_wire import HELLO, SECRET_BYTES


class _SilentPeer:
    """A listening socket that accepts, reads everything, and never answers or closes
    (a frozen worker; to the client, as a host gone while its last bytes were acknowledged)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = bytearray()
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.conns.append(conn)
        while True:
            try:
                data = conn.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            self.received += data

    def close(self) -> None:
        self.listener.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def silent_peer():
    peer = _SilentPeer()
    yield peer
    peer.close()


@pytest.mark.timeout(30)
def test_the_lane_socket_has_keepalive_and_a_user_timeout(silent_peer):
    conn = LaneConnection("127.0.0.1", silent_peer.port, b"s" * SECRET_BYTES, loss_timeout_s=12)
    try:
        sock = conn._sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
            interval = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
            count = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
            assert count == KEEPALIVE_PROBES
            assert idle + interval * count <= 12  # the kernel gives up within the timeout
            assert idle < 12
        if sys.platform.startswith("linux"):
            assert sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", 18)) == 12_000
    finally:
        conn.close()


@pytest.mark.timeout(30)
def test_a_peer_that_never_answers_ends_a_wait_without_deadline_in_bounded_time(silent_peer):
    conn = LaneConnection("127.0.0.1", silent_peer.port, b"s" * SECRET_BYTES, loss_timeout_s=0.5)
    try:
        rid = conn.send("fetch_outcomes", (0, 0, 0.3), wait_s=0.3)  # a long poll: due 0.8 s after
        assert rid is not None
        start = time.monotonic()
        with pytest.raises(LaneBroken, match="taken as lost"):
            conn.wait(rid, None)
        took = time.monotonic() - start
        assert 0.7 <= took < 10
        assert conn.broken is not None
        assert silent_peer.received.startswith(HELLO)  # it was sent, and read: only never answered
    finally:
        conn.close()


@pytest.mark.timeout(30)
def test_a_reply_within_its_due_is_waited_for(silent_peer):
    """A long poll the actor may hold is not taken as lost before its wait_s plus the timeout."""
    conn = LaneConnection("127.0.0.1", silent_peer.port, b"s" * SECRET_BYTES, loss_timeout_s=0.3)
    try:
        rid = conn.send("fetch_outcomes", (0, 0, 1.0), wait_s=1.0)
        with pytest.raises(TimeoutError):
            conn.wait(rid, time.monotonic() + 0.6)  # the caller's deadline, before the due
        assert conn.broken is None
    finally:
        conn.close()


@pytest.mark.timeout(30)
def test_a_result_on_a_silent_lane_falls_back_and_the_handle_leaves_the_lane(silent_peer):
    """``LaneFuture.result()`` with no timeout ends and makes the call again (through Dask
    in real use); the lane client then stays off the lane."""
    endpoint: concurrent.futures.Future = concurrent.futures.Future()
    endpoint.set_result(("127.0.0.1", silent_peer.port, b"s" * SECRET_BYTES))
    lane = LaneClient(lambda: endpoint, loss_timeout_s=0.4)
    assert lane.connection() is None  # the first call finds the endpoint
    conn = lane.connection()
    assert conn is not None
    redone = []

    def redo():
        redone.append(1)
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result("through dask")
        return done

    rid = conn.send("put_batch", (b"blob", b"token", 0))
    start = time.monotonic()
    assert LaneFuture(conn, rid, redo).result() == "through dask"
    assert time.monotonic() - start < 10
    assert redone == [1]
    assert lane.connection() is None and lane.peer() is None
    lane.close()


@pytest.mark.timeout(30)
def test_put_batch_is_a_plain_wrapper_over_the_plainly_named_put_now():
    """queue/base.py: ``_put_now`` is its own def (the body), ``put_batch`` the actor method
    around it (no redefinition of one name over the other)."""
    from daskqueue.queue.base import QueueActorBase

    assert QueueActorBase._put_now.__name__ == "_put_now"
    assert QueueActorBase.put_batch.__name__ == "put_batch"
    assert QueueActorBase.put_batch is not QueueActorBase._put_now
