"""The queue actor's side of the lane (:mod:`daskqueue.queue.lane`): a small asyncio server
on the worker's event loop that runs a client's puts and outcome polls on the actor.

A mixin of :class:`~daskqueue.queue.base.QueueActorBase`. The server starts on the first
``lane_endpoint`` call (a client's, or another worker's, through Dask: see
:mod:`daskqueue.queue.worker_lane`): no socket is opened for a pool whose clients and
workers never ask, nor where the worker's config says ``daskqueue.lane: False`` (or the
config of the client that made the pool did), its address is not ``tcp://``, or its
``Security`` requires encryption. It listens on the host
of the worker's address, on a port the system picks, and serves only connections that
start with the secret it handed out through Dask. ``_stop_lane`` (the actor's close) says
goodbye on every connection (their calls in flight go through Dask) and closes them and
the listening socket.

A request runs ``getattr(actor, method)(*args)`` as Dask's ``actor_execute`` does (the
worker set as the current one), so a durable queue's wrapped ``put_batch`` and every check
of the method apply as they do through Dask. A request for an actor the worker no longer
holds (released) is answered ``FALLBACK``: the client asks Dask, which says so.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import pickle
import socket
from typing import Any

from daskqueue.queue.lane import lane_loss_timeout
from daskqueue.queue.lane_connection import set_loss_detection
from daskqueue.queue.lane_wire import (
    CLIENT_METHODS,
    ERROR,
    FALLBACK,
    GOODBYE_ID,
    HEADER,
    HELLO,
    MAX_FRAME_BYTES,
    METHODS,
    OK,
    SECRET_BYTES,
    LaneProtocolError,
    decode_args,
    encode_reply,
)

__all__ = ["LaneMixin", "LaneServer"]

logger = logging.getLogger("daskqueue")

#: How long closing the lane waits for the listening socket to close.
_CLOSE_WAIT_S = 1.0


class LaneServer:
    """One actor's lane server on its worker's event loop (see the module docstring)."""

    def __init__(self, actor: Any, key: str, worker: Any) -> None:
        self.actor = actor
        self.key = key
        self.worker = worker
        self.secret = os.urandom(SECRET_BYTES)
        #: A connection whose peer is gone ends about this long after (TCP keepalive and
        #: user timeout, as the client's end); one that sends no hello is closed after it.
        self.loss_timeout_s = lane_loss_timeout()
        self.connections: set[_LaneProtocol] = set()
        #: Set when closing starts: a request read from then on is answered ``FALLBACK``
        #: (not run), so that a call the actor never answered was never made here.
        self.closing = False
        self._server: asyncio.AbstractServer | None = None
        self.endpoint: tuple[str, int, bytes] | None = None

    async def start(self, host: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _LaneProtocol(self), host=host, port=0)
        port = self._server.sockets[0].getsockname()[1]
        self.endpoint = (host, port, self.secret)
        logger.debug("queue actor %s serves its lane on %s:%d", self.key, host, port)

    def serving(self) -> bool:
        """Whether the worker still holds this actor (a released one is not served here)."""
        return self.worker.state.actors.get(self.key) is self.actor

    async def close(self) -> None:
        """Stop listening, let the calls under way answer (at most ``_CLOSE_WAIT_S``: an
        answer the caller never reads would leave it unsure whether its call was made), say
        goodbye on every connection and close them."""
        server, self._server = self._server, None
        self.closing = True
        if server is not None:
            server.close()
        running = [t for conn in self.connections for t in conn.running()]
        if running:
            await asyncio.wait(running, timeout=_CLOSE_WAIT_S)
        goodbye = encode_reply(GOODBYE_ID, FALLBACK)
        for conn in list(self.connections):
            conn.close(goodbye)
        self.connections.clear()
        if server is not None:
            try:
                await asyncio.wait_for(server.wait_closed(), _CLOSE_WAIT_S)
            except asyncio.TimeoutError:
                pass


class _LaneProtocol(asyncio.Protocol):
    """One client connection: its hello, then requests, each run as a task."""

    def __init__(self, server: LaneServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._hello = False
        self._hello_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_loss_detection(sock, self._server.loss_timeout_s)
        self._hello_timer = asyncio.get_running_loop().call_later(self._server.loss_timeout_s, self._no_hello)
        self._server.connections.add(self)

    def _no_hello(self) -> None:
        if not self._hello:
            logger.debug("lane: a connection sent no hello in %.0f s; closed", self._server.loss_timeout_s)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self._server.connections.discard(self)
        self._transport = None

    def running(self) -> list[asyncio.Task[None]]:
        """The calls of this connection under way."""
        return list(self._tasks)

    def close(self, last: bytes = b"") -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if last:
                transport.write(last)
            transport.close()  # after what is buffered is written

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        try:
            if not self._hello:
                need = len(HELLO) + SECRET_BYTES
                if len(buf) < need:
                    return
                if not (buf[: len(HELLO)] == HELLO
                        and hmac.compare_digest(bytes(buf[len(HELLO) : need]), self._server.secret)):
                    raise LaneProtocolError("bad hello")
                self._hello = True
                if self._hello_timer is not None:
                    self._hello_timer.cancel()
                del buf[:need]
            pos, size, head = 0, len(buf), HEADER.size
            while size - pos >= head:
                length, rid, code = HEADER.unpack_from(buf, pos)
                if length > MAX_FRAME_BYTES:
                    raise LaneProtocolError(f"frame of {length} bytes")
                if size - pos - head < length:
                    break
                method = METHODS.get(code)
                if method is None:
                    raise LaneProtocolError(f"unknown method code {code}")
                args = decode_args(memoryview(buf)[pos + head : pos + head + length])
                pos += head + length
                task = asyncio.get_running_loop().create_task(self._run(rid, method, args))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if pos:
                del buf[:pos]
        except LaneProtocolError as e:
            logger.warning("queue actor %s: lane connection closed: %s", self._server.key, e)
            self.close()

    async def _run(self, rid: int, method: str, args: tuple[Any, ...]) -> None:
        from distributed.worker import _worker_cvar

        server = self._server
        if server.closing or not server.serving():
            self._reply(rid, FALLBACK)
            return
        token = _worker_cvar.set(server.worker)
        try:
            result = await getattr(server.actor, method)(*args)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this request's task is being cancelled (the loop stops): no reply
            # the method itself ended cancelled: the caller learns nothing more through Dask
            status, value = ERROR, RuntimeError(f"queue actor {server.key}: {method} was cancelled")
        except Exception as e:
            status, value = ERROR, e
        else:
            status, value = OK, result
        finally:
            _worker_cvar.reset(token)
        try:
            body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            if method in CLIENT_METHODS:  # made again through Dask, which has its own ways (safe for these two)
                self._reply(rid, FALLBACK)
                return
            # a worker's call ran, and is never made twice (see worker_lane): its error's text goes
            what = f"{type(value).__name__}: {value}" if status == ERROR else f"{method}'s answer does not pickle"
            body, status = pickle.dumps(RuntimeError(what)), ERROR
        self._reply(rid, status, body)

    def _reply(self, rid: int, status: int, body: bytes = b"") -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(encode_reply(rid, status, body))


class LaneMixin:
    """``lane_endpoint`` and ``_stop_lane`` of the queue actor (see the module docstring)."""

    _closed: bool
    _handed_off: bool
    _lane_server: LaneServer | None = None
    _lane_ok: bool = True  # set by the actor's constructor (its pool's ``daskqueue.lane``)

    async def lane_endpoint(self, key: str) -> tuple[str, int, bytes] | None:
        """``(host, port, secret)`` of this actor's lane, started now if it is not yet
        (``key``: the actor's Dask key, as the caller's handle knows it); None where no lane
        may be served (see the module docstring), or if ``key`` is not this actor's."""
        if self._closed or self._handed_off or not self._lane_ok:
            return None
        if self._lane_server is None:
            server = await _start_server(self, key)
            if server is None or self._closed:  # closed while it started
                if server is not None:
                    await server.close()
                return None
            if self._lane_server is None:
                self._lane_server = server
            else:  # two first calls at once: keep the first
                await server.close()
        return self._lane_server.endpoint

    async def _stop_lane(self) -> None:
        """Close the lane (the actor stops serving). Idempotent."""
        server, self._lane_server = self._lane_server, None
        if server is not None:
            await server.close()


async def _start_server(actor: Any, key: str) -> LaneServer | None:
    """A started lane server for ``actor``, or None where none may be served."""
    from distributed import get_worker
    from distributed.comm.addressing import get_address_host

    from daskqueue.queue.lane import lane_enabled

    try:
        worker = get_worker()
    except ValueError:
        return None
    security = getattr(worker, "security", None)
    if (not worker.address.startswith("tcp://") or getattr(security, "require_encryption", False)
            or not lane_enabled() or worker.state.actors.get(key) is not actor):
        return None
    server = LaneServer(actor, key, worker)
    try:
        await server.start(get_address_host(worker.address))
    except OSError as e:
        logger.warning("queue actor %s: no lane (%s); its clients call through Dask", key, e)
        return None
    return server
