"""Small defects of the lane's client side (branch lat4): each test fails before its fix."""

from __future__ import annotations

import concurrent.futures
import pickle
import select
import threading
import time

import pytest

from daskqueue.queue import lane as lane_module
from daskqueue.queue import lane_connection
from daskqueue.queue.lane_wire import OK
from tests import tasks


@pytest.mark.timeout(60)
def test_a_method_looked_up_while_the_lane_is_found_asks_the_lane_once(pools, monkeypatch):
    """``DirectActor.__getattr__`` asked its lane twice per put or poll while the lane's
    endpoint was being found (the short path, then the long one again)."""
    qp = pools.queue(1)
    handle = qp.queues[0]
    never = concurrent.futures.Future()  # a discovery that is never answered
    real_init = lane_module.LaneClient.__init__
    monkeypatch.setattr(lane_module.LaneClient, "__init__",
                        lambda self, discover, **kw: real_init(self, lambda: never, **kw))
    asked = []
    real_connection = lane_module.LaneClient.connection
    monkeypatch.setattr(lane_module.LaneClient, "connection", lambda self: asked.append(1) or real_connection(self))
    handle.close_lane()
    handle._lane, handle._lane_checked = None, False  # as a handle that has made no put yet
    for _ in range(3):
        assert callable(handle.fetch_outcomes)
    assert len(asked) == 3
    assert handle.lane_peer() is None


class _AnsweringPeer:
    """A lane server stand-in: takes the hello, then answers every request ``OK`` (``None``)
    after ``delay_s``, from a thread of its own."""

    def __init__(self, delay_s: float = 0.01) -> None:
        import socket

        self.delay_s = delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import pickle

        from daskqueue.queue.lane_wire import HEADER, HELLO, OK, SECRET_BYTES, encode_reply

        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.conns.append(conn)
        buf = bytearray()
        need = len(HELLO) + SECRET_BYTES
        while True:
            try:
                data = conn.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            buf += data
            if need:
                if len(buf) < need:
                    continue
                del buf[:need]
                need = 0
            while len(buf) >= HEADER.size:
                length, rid, _ = HEADER.unpack_from(buf)
                if len(buf) < HEADER.size + length:
                    break
                del buf[: HEADER.size + length]
                time.sleep(self.delay_s)
                conn.sendall(encode_reply(rid, OK, pickle.dumps(None)))

    def close(self) -> None:
        self.listener.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def answering_peer():
    peer = _AnsweringPeer()
    yield peer
    peer.close()


def _connect(peer) -> lane_connection.LaneConnection:
    from daskqueue.queue.lane_wire import SECRET_BYTES

    return lane_connection.LaneConnection("127.0.0.1", peer.port, b"s" * SECRET_BYTES, loss_timeout_s=10)


@pytest.mark.timeout(30)
def test_waiting_for_replies_makes_no_poll_object_per_wait(answering_peer, monkeypatch):
    """``_wait_fd`` built and registered a ``select.poll()`` on every wait for a reply."""
    conn = _connect(answering_peer)
    made = []
    real_poll = select.poll
    monkeypatch.setattr(select, "poll", lambda: made.append(1) or real_poll())
    try:
        for i in range(5):
            rid = conn.send("fetch_outcomes", (0, 0, 0.0))
            status, body = conn.wait(rid, time.monotonic() + 10)
            assert status == OK and pickle.loads(body) is None
        assert made == []
    finally:
        conn.close()


#: How long the slow connect below is held before it even starts (see its test).
HELD_S = 10.0


@pytest.mark.timeout(60)
def test_a_slow_connect_to_the_lane_leaves_the_other_threads_on_dask_meanwhile(monkeypatch):
    """``LaneClient``'s connect (up to ``CONNECT_TIMEOUT_S``) held its lock: every other
    thread's put or poll on that handle waited for it."""
    import socket

    from daskqueue.queue.lane_wire import SECRET_BYTES

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):  # a full backlog: the kernel drops the next SYNs, a connect hangs
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(s)
    connecting, release = threading.Event(), threading.Event()
    real_connection = lane_module.LaneConnection

    def slow_connection(*args, **kwargs):
        connecting.set()
        release.wait(HELD_S)  # the connect cannot end before the test's other call did
        return real_connection(*args, **kwargs)

    monkeypatch.setattr(lane_module, "LaneConnection", slow_connection)
    found = concurrent.futures.Future()
    found.set_result(("127.0.0.1", port, b"s" * SECRET_BYTES))
    lane = lane_module.LaneClient(lambda: found, loss_timeout_s=10)
    try:
        assert lane.connection() is None  # starts finding the endpoint
        first = []
        t = threading.Thread(target=lambda: first.append(lane.connection()), daemon=True)
        t.start()
        assert connecting.wait(10)
        start = time.monotonic()
        assert lane.connection() is None  # through Dask meanwhile, not behind the connect
        # The connect is held HELD_S (then times out): a call behind it takes that long; one
        # that is not, no time at all (a bound far from both, as a loaded machine needs).
        assert time.monotonic() - start < HELD_S / 2
        release.set()
        t.join(10)
        assert first == [None]  # the connect timed out: the lane is given up
        assert lane.connection() is None and lane.peer() is None
    finally:
        lane.close()
        listener.close()
        for s in fillers:
            s.close()
