"""A worker's calls to a queue actor on another worker, through the actor's lane.

Why: a Dask actor call from one worker to another cost 1.3-1.4 ms of the caller's CPU and
1.0-1.1 ms of the callee's on this machine (each argument serialized on its own, msgpack
and frames, the comm's handlers), and 2.2-2.4 ms of wall time; by lane 0.3 ms of each
(``python -m benchmarks.worker_calls``, 2026-11-25). A consumer makes two such calls per batch it takes from a queue on another
worker (``get_batch``, ``settle``), and a queue one per peer each time it announces work
(``work_at``): on a stream of short tasks, those calls were most of what the workers spent
beyond ``map`` (see ``benchmarks/README.md``, stop 35). The queue actor's lane server
(:mod:`daskqueue.queue.lane_server`) takes them as it takes a client's puts; this module is
the calling side, on the worker's event loop (the client's side,
:mod:`daskqueue.queue.lane`, is a thread's).

What goes by lane (:func:`lane_call`): the methods of
:data:`~daskqueue.queue.lane_wire.WORKER_METHODS`, called through a :class:`WorkerActor`
handle on a worker's event loop, whose arguments the wire encodes (a typed pool's ``sizes``
dict does not: that call goes through Dask). The lane of an actor is asked for once
(``lane_endpoint``, through Dask) and kept while it works; an actor that serves none
(``daskqueue.lane: False``, not ``tcp://``, TLS required), or whose lane failed, is called
through Dask for ``LANE_RETRY_S``, then asked again.

Contracts:

* Nothing is made twice. A call whose request could not be written goes through Dask; so
  does one still unanswered when the actor says goodbye (it closes: from the moment its
  closing starts, it answers every request it reads ``FALLBACK``, unrun, and it lets the
  calls under way answer before the goodbye). A lane that breaks without a goodbye after
  the request went out fails the call with ``OSError``, as Dask's comm does when it breaks
  mid-call (the caller's handling of that is unchanged: a fetch skips the queue a while, a
  settle is made again where the queue moved).
* ``FALLBACK`` (the worker no longer holds the actor, or it is closing) makes the same call
  through Dask, which says what it says.
* A request over ``MAX_REQUEST_BYTES`` (a settle of huge results) goes through Dask.
* The caller's deadline and loss detection (``QueueCalls``) apply as to any call; the
  connection has the kernel's loss detection too (TCP keepalive and user timeout, as the
  client's lanes).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import socket
import time
from typing import Any, Awaitable, Callable

from daskqueue.queue.lane import lane_loss_timeout
from daskqueue.queue.lane_connection import set_loss_detection
from daskqueue.queue.lane_wire import (
    ERROR,
    FALLBACK,
    GOODBYE_ID,
    HEADER,
    HELLO,
    MAX_FRAME_BYTES,
    METHOD_CODES,
    OK,
    WORKER_METHODS,
    encode_request,
)

__all__ = ["lane_call", "WORKER_METHODS", "LANE_OPEN_TIMEOUT_S"]

logger = logging.getLogger("daskqueue")

#: How long opening a connection to a lane may take before the call goes through Dask.
LANE_OPEN_TIMEOUT_S = 5.0

#: A request with more bytes than this goes through Dask (the lane is for small calls, and
#: its frames have a bound: ``MAX_FRAME_BYTES``).
MAX_REQUEST_BYTES = 64 << 20


class _NotSent(Exception):
    """The request was not written, or the actor said goodbye before running it: the call
    may go through Dask instead."""


class _Lane:
    """One connection to one queue actor's lane server, on this worker's event loop."""

    def __init__(self, key: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.entry: tuple[int, str, str] | None = None  # where _lanes holds it (see _lane_of)
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.broken: str | None = None
        self._reading = asyncio.get_running_loop().create_task(self._read_forever())

    @classmethod
    async def open(cls, key: str, host: str, port: int, secret: bytes) -> _Lane:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), LANE_OPEN_TIMEOUT_S)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_loss_detection(sock, lane_loss_timeout())
        writer.write(HELLO + secret)
        return cls(key, reader, writer)

    async def request(self, code: int, args: tuple[Any, ...]) -> tuple[int, bytes]:
        """``(status, body)`` of the reply; :class:`_NotSent` if the request was not written
        (the lane is broken, or the arguments have no encoding), ``OSError`` if the lane
        broke after it was."""
        if self.broken is not None:
            raise _NotSent(self.broken)
        rid = next(self._ids)
        if rid > 0xFFFFFFFF:  # u32 request ids: a new connection after four billion calls
            self.close("request ids ran out")
            raise _NotSent(self.broken)
        frame = encode_request(rid, code, args)
        if frame is None or len(frame) > MAX_REQUEST_BYTES:
            raise _NotSent("an argument has no encoding on the lane, or the request is too large")
        if self._writer.transport.is_closing():  # (a write would be dropped silently)
            self.close("the connection is closing")
            raise _NotSent(self.broken)
        reply: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = reply
        try:
            self._writer.write(frame)
        except Exception as e:  # the transport is closing: nothing went out
            self._pending.pop(rid, None)
            self.close(f"write failed: {e}")
            raise _NotSent(self.broken) from None
        try:
            return await reply
        finally:
            self._pending.pop(rid, None)

    async def _read_forever(self) -> None:
        reason = "the connection closed"
        goodbye = False
        try:
            while True:
                head = await self._reader.readexactly(HEADER.size)
                length, rid, status = HEADER.unpack(head)
                if length > MAX_FRAME_BYTES:
                    reason = f"a reply frame of {length} bytes"
                    return
                body = await self._reader.readexactly(length) if length else b""
                if rid == GOODBYE_ID and status == FALLBACK:
                    reason, goodbye = "the actor closed its lane", True
                    return
                reply = self._pending.get(rid)
                if reply is not None and not reply.done():
                    reply.set_result((status, body))
        except (asyncio.IncompleteReadError, OSError) as e:
            reason = f"the connection broke ({type(e).__name__}: {e})"
        finally:
            self.close(reason, unanswered=goodbye)

    def close(self, reason: str, *, unanswered: bool = False) -> None:
        """Break the lane: its calls waiting for a reply fail with ``OSError``, or, after the
        actor's goodbye (``unanswered``: it ran none of them), go through Dask."""
        if self.broken is None:
            self.broken = reason
            logger.debug("worker lane to queue actor %s closed: %s", self.key, reason)
            if self.entry is not None and _lanes.get(self.entry) is self:
                _settle(self.entry, None)
        pending, self._pending = self._pending, {}
        for reply in pending.values():
            if not reply.done():
                reply.set_exception(_NotSent(reason) if unanswered else
                                    ConnectionResetError(f"lane to queue actor {self.key} lost: {reason}"))
        try:
            self._writer.close()
        except Exception:  # the loop is closing
            pass
        if not self._reading.done() and asyncio.current_task() is not self._reading:
            self._reading.cancel()


#: How long an actor that has no lane for this worker (it serves none, opening one failed,
#: or its lane broke) is called through Dask before its lane is asked for again: an actor
#: whose hand-off was called off serves again, a refused connection may have been a blip.
LANE_RETRY_S = 10.0

#: Per event loop (a worker's), actor key and address: its lane, the task opening it, or the
#: monotonic time until which it is called through Dask.
_lanes: dict[tuple[int, str, str], _Lane | asyncio.Task[_Lane | None] | float] = {}

#: Past this many entries, those of actors called through Dask are forgotten: a long-lived
#: worker that calls the queues of many pools, one after another, keeps at most this many (a
#: forgotten actor's next call asks for its lane again, through Dask).
MAX_ENTRIES = 1024


def _settle(k: tuple[int, str, str], lane: _Lane | None) -> None:
    """Keep ``lane`` for ``k``; None: ``k`` goes through Dask for ``LANE_RETRY_S``."""
    _lanes[k] = time.monotonic() + LANE_RETRY_S if lane is None else lane
    if lane is None and len(_lanes) > MAX_ENTRIES:
        for old in [key for key, v in _lanes.items() if isinstance(v, float)]:
            del _lanes[old]


async def _lane_of(handle: Any, dask_call: Callable[[str, tuple[Any, ...]], Awaitable[Any]]) -> _Lane | None:
    # (the address too: an actor Dask placed again under its key elsewhere is another lane)
    k = (id(asyncio.get_running_loop()), handle.key, handle._address)
    entry = _lanes.get(k)
    if isinstance(entry, _Lane):
        if entry.broken is None:
            return entry
        _settle(k, None)  # broken: through Dask a while
        return None
    if isinstance(entry, float):
        if time.monotonic() < entry:
            return None
        entry = None  # time to ask for its lane again
    elif entry is not None and entry.done() and (entry.cancelled() or entry.exception() is not None):
        entry = None  # an opening cut short (the loop stopping): open again
    if entry is None:
        entry = _lanes[k] = asyncio.get_running_loop().create_task(_open(handle, dask_call))
    lane = await asyncio.shield(entry)
    if _lanes.get(k) is entry:
        _settle(k, lane)
        if lane is not None:
            lane.entry = k
    return lane


async def _open(handle: Any, dask_call: Callable[[str, tuple[Any, ...]], Awaitable[Any]]) -> _Lane | None:
    try:
        endpoint = await asyncio.wait_for(dask_call("lane_endpoint", (handle.key,)), LANE_OPEN_TIMEOUT_S)
        if endpoint is None:
            return None
        host, port, secret = endpoint
        return await _Lane.open(handle.key, host, port, secret)
    except Exception as e:  # no lane: this actor is called through Dask
        logger.debug("no worker lane to queue actor %s (%s: %s); calling it through Dask", handle.key,
                     type(e).__name__, e)
        return None


async def lane_call(handle: Any, method: str, args: tuple[Any, ...],
                    dask_call: Callable[[str, tuple[Any, ...]], Awaitable[Any]]) -> Any:
    """``method(*args)`` of the actor behind ``handle`` (on another worker), by its lane if it
    has one, else ``dask_call(method, args)`` (see the module docstring)."""
    lane = await _lane_of(handle, dask_call)
    if lane is not None:
        try:
            status, body = await lane.request(METHOD_CODES[method], args)
        except _NotSent:
            pass
        else:
            if status == OK:
                return pickle.loads(body)
            if status == ERROR:
                raise pickle.loads(body)
    return await dask_call(method, args)


def forget_lanes() -> None:
    """Close every lane of this process (tests; a worker's lanes otherwise live with it)."""
    for entry in list(_lanes.values()):
        if isinstance(entry, _Lane):
            entry.close("forgotten")
    _lanes.clear()
