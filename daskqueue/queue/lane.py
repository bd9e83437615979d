"""The lane: a synchronous client's small calls to a queue actor over a plain socket of
its own, read and written by the calling thread.

Why: after an idle gap, a Dask actor call from a client's thread costs ~2-3 ms on this
machine, most of it Python code of Dask's comm stack (a hop to the client's event loop,
msgpack and frames, the worker's handler dispatch and ``actor_execute``) and thread
hand-overs; a raw TCP round trip between two processes costs 0.16 ms. A task's
``submit`` -> ``result`` makes two such calls (the put, the outcome poll). The lane carries
exactly those two methods (:data:`~daskqueue.queue.lane_wire.CLIENT_METHODS`) from the caller's
thread to a small asyncio server the queue actor runs on its worker's event loop
(:mod:`daskqueue.queue.lane_server`); everything else goes through Dask as before.

When (:func:`lane_allowed`): a synchronous client, calling from its own thread, plain
``tcp://`` addresses, no TLS required by its ``Security``, and the Dask config key
``daskqueue.lane`` true (the default; ``False`` on the client or the workers means no
listening socket is ever opened). Anything else (tls, inproc, ucx, an asynchronous client,
calls from a worker) goes through Dask, silently.

Contracts:

* Every read has a deadline (the caller's ``result(timeout)``, and for ``result()`` the
  reply's due plus ``distributed.comm.timeouts.tcp``: see :func:`lane_loss_timeout`); a lane
  that fails (the connection breaks or its host is taken as lost, a malformed frame, the
  actor's goodbye) makes each call in flight on
  it again through Dask (:class:`LaneFuture`): both methods are safe to send twice (a put
  carries its token, a fetch is read-only below its cursors), so no message is lost or
  stored twice, and a dead worker gives the errors Dask's calls give. A handle whose lane
  failed stays on Dask.
* Thread-safe: one connection per handle, sends under a lock; one thread at a time reads
  and files the replies for the others (:class:`LaneConnection`).
* Fork-safe: a connection made by another process is never used (the pid is checked).
* Nothing outlives its owner: :meth:`LaneClient.close` (the pool releasing the handle)
  closes the socket; a handle that pickles never carries one.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from typing import Any, Callable

from daskqueue.queue.lane_connection import LaneBroken, LaneConnection
from daskqueue.queue.lane_wire import ERROR, OK

__all__ = ["LaneClient", "LaneConnection", "LaneFuture", "LaneBroken", "lane_allowed", "lane_enabled",
           "lane_loss_timeout", "LANE_MAX_PUT_BYTES", "LANE_HOLD_PUT_BYTES"]

logger = logging.getLogger("daskqueue")

#: A put blob larger than this goes through Dask. ``map``'s and ``batch_submit``'s puts
#: (hundreds of KiB to a few MiB) go on the lane too: written by the calling thread they cost
#: the client less than a trip through Dask's loop (``map`` of 1M no-ops 1.31x the rate with
#: them on the lane, in one process, alternated; benchmarks/README.md, stop 29).
LANE_MAX_PUT_BYTES = 64 * 1024 * 1024

#: A put blob up to this size is held back to go out with the outcome poll that follows it
#: (``LaneConnection.send(hold=True)``: one write, one wake-up of the worker). A larger one
#: goes out at once: ``map`` pipelines its puts, and holding one until the next is encoded
#: would delay the queue's work by a batch.
LANE_HOLD_PUT_BYTES = 64 * 1024


#: ``LaneFuture.done()`` looks whether anything can be read before it takes the reader's
#: path (which reads the socket and raises and catches a ``TimeoutError`` when nothing is
#: there): ``result()`` asks each primed outcome poll ``done()`` before it waits. A module
#: attribute so that a benchmark can switch it off and on.
QUICK_DONE = True


def lane_enabled() -> bool:
    """The Dask config key ``daskqueue.lane`` (default True)."""
    import dask

    return bool(dask.config.get("daskqueue.lane", True))


def lane_loss_timeout() -> float:
    """How long a lane waits past a reply's due, and what its TCP keepalive and user timeout
    derive from (:mod:`~daskqueue.queue.lane_connection`): Dask's own
    ``distributed.comm.timeouts.tcp`` (default 30 s), so a lost host ends a wait on the lane
    about when it would end one on Dask's comm."""
    import dask
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("distributed.comm.timeouts.tcp", "30s"), default="seconds"))


def lane_allowed(client: Any, address: str) -> bool:
    """Whether calls of ``client`` (synchronous, from its own thread) to an actor at
    ``address`` may use a lane (see the module docstring). A client made asynchronous never
    may: Dask's ``Client.asynchronous`` reads False on a thread without a running loop, e.g.
    where a pool's ``*_async`` methods run their blocking twins (``asyncio.to_thread``), and
    such a pool's handle then took a lane (the mode the client was made in decides)."""
    if client is None or client.asynchronous or getattr(client, "_asynchronous", False):
        return False
    if not address.startswith("tcp://"):
        return False
    security = getattr(client, "security", None)
    if security is not None and getattr(security, "require_encryption", False):
        return False
    scheduler = getattr(getattr(client, "scheduler", None), "address", "") or ""
    if scheduler and not scheduler.startswith("tcp://"):
        return False
    return lane_enabled()


class LaneFuture:
    """A call sent on a lane: ``result(timeout)`` and ``done()`` as on a
    :class:`~daskqueue.queue.actor_handles.CallFuture` (a timeout raises the builtin
    ``TimeoutError`` and leaves the call in flight). If the lane fails, or the actor answers
    ``FALLBACK``, the call is made again through Dask (``redo()``), and that answer counts."""

    __slots__ = ("_conn", "_rid", "_redo", "_reply", "_fallback", "__weakref__")

    def __init__(self, conn: LaneConnection, rid: int, redo: Callable[[], Any]) -> None:
        self._conn = conn
        self._rid = rid
        self._redo = redo
        self._reply: tuple[int, bytes] | None = None
        self._fallback: Any = None

    def done(self) -> bool:
        if self._fallback is not None:
            return bool(self._fallback.done())
        if self._reply is not None:
            return True
        if QUICK_DONE and not self._conn.may_have(self._rid):
            return False  # nothing to read: not done, without the reader's path and its TimeoutError
        try:
            self._take(time.monotonic())
        except TimeoutError:
            return False
        return True

    def result(self, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._fallback is None:
            self._take(deadline)
        if self._fallback is not None:
            return self._fallback.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
        status, body = self._reply  # type: ignore[misc]
        if status == OK:
            return pickle.loads(body)
        raise pickle.loads(body)

    def _take(self, deadline: float | None) -> None:
        """Read the reply (or start the fallback) unless done already; ``TimeoutError``."""
        if self._reply is not None or self._fallback is not None:
            return
        try:
            reply = self._conn.wait(self._rid, deadline)
        except LaneBroken as e:
            logger.debug("lane call %d goes through Dask: %s", self._rid, e)
            self._fallback = self._redo()
            return
        if reply[0] not in (OK, ERROR):
            self._fallback = self._redo()
            return
        self._reply = reply

    def __del__(self) -> None:
        if self._reply is None and self._fallback is None:
            try:
                self._conn.forget(self._rid)
            except Exception:  # at interpreter exit
                pass


class LaneClient:
    """A handle's lane: found through one Dask call (``discover()``, returning a concurrent
    future of the actor's ``lane_endpoint``), connected on the first call after that
    answer, given up for good if anything fails. Thread-safe. ``loss_timeout_s``: see
    :func:`lane_loss_timeout` (its default)."""

    def __init__(self, discover: Callable[[], Any], *, loss_timeout_s: float | None = None) -> None:
        self._discover = discover
        self._loss_timeout_s = loss_timeout_s
        self._lock = threading.Lock()
        self._finding: Any = None
        self._conn: LaneConnection | None = None
        self._connecting = False  # a thread connects (outside the lock): the others use Dask
        self._off = False
        self._pid = os.getpid()

    def connection(self) -> LaneConnection | None:
        """The connection to use now, or None (not known yet, or no lane: use Dask)."""
        conn = self._conn
        if conn is not None and conn.broken is None and conn.pid == self._pid == os.getpid():
            return conn
        if self._off:
            return None
        with self._lock:
            step = self._advance()
            if not isinstance(step, tuple):
                return step
            self._connecting = True
        # The connect (up to CONNECT_TIMEOUT_S) holds no lock: the handle's other threads
        # go through Dask meanwhile instead of waiting for it.
        host, port, secret = step
        try:
            loss_s = lane_loss_timeout() if self._loss_timeout_s is None else self._loss_timeout_s
            conn = LaneConnection(host, port, secret, loss_timeout_s=loss_s)
        except BaseException as e:
            with self._lock:
                self._connecting = False
                if isinstance(e, OSError):
                    self._give_up(f"cannot connect to the lane at {host}:{port}: {e}")
                    return None
            raise
        with self._lock:
            self._connecting = False
            if not self._off:  # else closed (or given up) meanwhile
                self._conn = conn
                return conn
        conn.close()
        return None

    def _advance(self) -> LaneConnection | tuple[str, int, bytes] | None:
        """The next step of finding the lane (under the lock): None (not yet, or never),
        or the endpoint to connect to now."""
        if self._connecting:
            return None
        if os.getpid() != self._pid:
            self._off = True  # a forked child: its parent's lane is not its own
            return None
        if self._conn is not None:  # broken
            self._give_up(f"lane broken: {self._conn.broken}")
            return None
        if self._finding is None:
            try:
                self._finding = self._discover()
            except Exception as e:
                self._give_up(f"no lane endpoint: {e}")
            return None
        if not self._finding.done():
            return None
        try:
            endpoint = self._finding.result(0)
        except BaseException as e:
            self._give_up(f"no lane endpoint: {type(e).__name__}: {e}")
            return None
        if endpoint is None:
            self._give_up("the actor serves no lane")
            return None
        host, port, secret = endpoint
        return host, port, secret

    def _give_up(self, why: str) -> None:
        logger.debug("queue calls go through Dask: %s", why)
        self._off = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def peer(self) -> tuple[str, int] | None:
        """``(host, port)`` of the lane server this client uses now (None: calls go through Dask)."""
        conn = self._conn
        if conn is None or conn.broken is not None or self._off or os.getpid() != self._pid:
            return None  # (a forked child: its parent's lane is not its own)
        return conn.peer

    def close(self) -> None:
        """Close the connection; later calls go through Dask."""
        with self._lock:
            self._off = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
