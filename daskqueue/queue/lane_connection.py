"""One socket to one queue actor's lane server (:mod:`daskqueue.queue.lane`), shared by the
threads of a client: requests out, replies back to whichever thread waits for them, every
read and write with a deadline. Nothing here imports Dask.

Loss of the actor's host (a partition, a host that vanished without closing its sockets)
is detected in bounded time, as Dask's own comms detect it (``distributed.comm.timeouts.tcp``):
the socket has TCP keepalive with short probes and ``TCP_USER_TIMEOUT`` (Linux) derived
from ``loss_timeout_s``, so the kernel errors a read on a connection whose peer is gone;
and every request is *due*: an actor answers a put at once and an outcome poll after its
``wait_s`` at the latest, so a reply still missing ``loss_timeout_s`` after that (a peer
that accepts and never answers, a frozen worker) breaks the connection too. Either way the
calls in flight go through Dask, which then reports the loss.
"""

from __future__ import annotations

import errno
import itertools
import os
import select
import socket
import sys
import threading
import time
from typing import Any

from daskqueue.queue.lane_wire import FALLBACK, GOODBYE_ID, HEADER, HELLO, MAX_FRAME_BYTES, METHOD_CODES, encode_request

__all__ = ["LaneConnection", "LaneBroken", "CONNECT_TIMEOUT_S", "SEND_TIMEOUT_S", "LOSS_TIMEOUT_S",
           "KEEPALIVE_PROBES", "set_loss_detection"]

#: How long the first connect to an actor's lane may take before the handle gives up on it.
CONNECT_TIMEOUT_S = 2.0

#: How long a send may wait for room in the socket's buffer before the lane is given up.
SEND_TIMEOUT_S = 5.0

#: Default of ``loss_timeout_s`` (Dask's ``distributed.comm.timeouts.tcp`` default).
LOSS_TIMEOUT_S = 30.0

#: Keepalive probes sent, unanswered, before the kernel drops the connection.
KEEPALIVE_PROBES = 3

#: ``TCP_USER_TIMEOUT`` (Linux >= 2.6.37; the socket module names it since Python 3.12).
_TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)

_POLL_IN = select.POLLIN | select.POLLERR | select.POLLHUP
_POLL_OUT = select.POLLOUT | select.POLLERR | select.POLLHUP


class LaneBroken(OSError):
    """The lane cannot carry a call (internal: the call goes through Dask)."""


def set_loss_detection(sock: socket.socket, timeout_s: float) -> None:
    """Make the kernel end a connection whose peer is gone within about ``timeout_s``:
    keepalive probes after ``timeout_s / 2`` of silence, ``KEEPALIVE_PROBES`` of them
    spread over the rest (an idle connection), and ``TCP_USER_TIMEOUT`` (data sent and
    not acknowledged). Options this system lacks are skipped."""
    whole = max(2, int(timeout_s))
    interval = max(1, whole // (2 * KEEPALIVE_PROBES))
    idle = max(1, whole - interval * KEEPALIVE_PROBES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        option = getattr(socket, name, None)
        if option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
            except OSError:
                pass
    if sys.platform.startswith("linux"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT, whole * 1000)
        except OSError:
            pass


class LaneConnection:
    """One socket to one actor's lane server; thread-safe (see the module docstring).

    Sends take ``_send_lock``. Replies are read by one thread at a time (``_reading``, under
    ``_cond``), which files replies for other requests in ``_replies`` and wakes their
    waiters; a waiter whose reply is not filed becomes the reader when the reader leaves.
    ``loss_timeout_s``: see the module docstring (how long past its due a reply may be late,
    and the kernel's keepalive and user timeout).
    """

    def __init__(self, host: str, port: int, secret: bytes, *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 loss_timeout_s: float = LOSS_TIMEOUT_S) -> None:
        self._sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_loss_detection(self._sock, loss_timeout_s)
            self._sock.sendall(HELLO + secret)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self._fd = self._sock.fileno()
        # One poller per direction, made once: the reader and the sender (each one thread at
        # a time: ``_reading``, ``_send_lock``) wait on their own (a poll object per wait
        # cost an allocation and a registration on every wait).
        self._poll_in = _poller(self._fd, _POLL_IN)
        self._poll_out = _poller(self._fd, _POLL_OUT)
        self.peer: tuple[str, int] = (host, port)
        self.pid = os.getpid()
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        # Re-entrant: a LaneFuture collected by the garbage collector while this thread holds
        # it calls forget().
        self._cond = threading.Condition(threading.RLock())
        self._reading = False
        self._replies: dict[int, tuple[int, bytes]] = {}
        self._unwanted: set[int] = set()
        self._held: list[bytes] = []  # requests held back (see send), under _send_lock
        self._held_ids: list[int] = []  # their ids: they fall due when written, not when held
        self._loss_s = loss_timeout_s
        #: Request id -> when its reply is overdue (monotonic), until it is read. Under
        #: ``_due_lock`` alone (written by senders and by the reader, which hold different
        #: locks; a leaf lock: nothing else is taken while it is held).
        self._due: dict[int, float] = {}
        self._due_lock = threading.Lock()
        self._buf = bytearray()
        #: Why the connection is unusable (None while it serves).
        self.broken: BaseException | None = None

    # -- sending ----------------------------------------------------------------------------

    def send(self, method: str, args: tuple[Any, ...], *, hold: bool = False, wait_s: float = 0.0) -> int | None:
        """Send a request; its id, or None if its arguments have no lane encoding. Raises
        :class:`LaneBroken` if the request did not go out whole (then it went nowhere: the
        actor's side reads only whole frames, and the connection is closed).

        ``hold``: keep the request back until the next send on this connection or the next
        wait for a reply on it (:meth:`flush`), whichever comes first: a put and the outcome
        poll that follows it then go out in one write (one wake-up of the actor's worker,
        one send, ~0.2 ms on a loaded machine), and a put nobody polls after goes out when
        its answer is waited for.

        ``wait_s``: how long the actor may hold the call by contract (a long poll's wait);
        its reply is overdue ``loss_timeout_s`` after that (see the module docstring)."""
        if self.broken is not None:
            raise LaneBroken(f"lane broken: {self.broken}")
        with self._send_lock:
            rid = next(self._ids) & 0xFFFFFFFF or next(self._ids)
            frame = encode_request(rid, METHOD_CODES[method], args)
            if frame is None:
                return None
            with self._due_lock:
                self._due[rid] = time.monotonic() + wait_s + self._loss_s
            if hold:
                self._held.append(frame)
                self._held_ids.append(rid)
                return rid
            if self._held:
                self._held.append(frame)
                frame = self._take_held()
            self._write(frame)
        return rid

    def flush(self) -> None:
        """Send the requests held back (see :meth:`send`); a failure breaks the connection
        (their waiters then go through Dask)."""
        with self._send_lock:
            if not self._held or self.broken is not None:
                return
            data = self._take_held()
            try:
                self._write(data)
            except LaneBroken:
                pass  # broken: their waiters go through Dask

    def _take_held(self) -> bytes:
        """The held requests as one write (under the send lock); each falls due from now."""
        due = time.monotonic() + self._loss_s  # held requests are puts: answered at once
        with self._due_lock:
            for rid in self._held_ids:
                if rid in self._due:
                    self._due[rid] = due
        data = b"".join(self._held)
        self._held.clear()
        self._held_ids.clear()
        return data

    def _write(self, data: bytes) -> None:
        """Send ``data`` whole (under the send lock), or break the connection and raise
        :class:`LaneBroken` (an interruption, such as a ``KeyboardInterrupt``, breaks it too,
        then goes on: part of a frame may be on the stream, and no later request may follow
        it there)."""
        try:
            self._send_all(data)
        except OSError as e:
            self._break(e)
            raise LaneBroken(f"lane send failed: {e}") from e
        except BaseException as e:
            self._break(e)
            raise

    def _send_all(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = None
        while view:
            try:
                n = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                n = 0
            view = view[n:]
            if view:
                now = time.monotonic()
                deadline = deadline or now + SEND_TIMEOUT_S
                if now >= deadline:
                    raise TimeoutError("lane send: the actor's side reads nothing")
                _wait(self._poll_out, deadline - now)

    # -- replies ----------------------------------------------------------------------------

    def wait(self, rid: int, deadline: float | None) -> tuple[int, bytes]:
        """``(status, body)`` of request ``rid``, by monotonic ``deadline`` (None: no limit;
        the caller's ``now``: only what has arrived) else builtin ``TimeoutError``; raises
        :class:`LaneBroken` once the connection failed or the actor said goodbye."""
        if self._held:
            self.flush()
        with self._cond:
            while True:
                reply = self._replies.pop(rid, None)
                if reply is not None:
                    return reply
                if self.broken is not None:
                    raise LaneBroken(f"lane broken: {self.broken}")
                if not self._reading:
                    self._reading = True
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("lane: no reply yet")
                self._cond.wait(left)
        try:
            while True:
                frames = self._read_frames(deadline)
                mine = None
                with self._due_lock:
                    for frid, _, _ in frames:
                        self._due.pop(frid, None)
                with self._cond:
                    for frid, status, body in frames:
                        if frid == GOODBYE_ID and status == FALLBACK:
                            self._break_locked(LaneBroken("the actor closed its lane"))
                        elif frid == rid:
                            mine = (status, body)
                        elif frid in self._unwanted:
                            self._unwanted.discard(frid)
                        else:
                            self._replies[frid] = (status, body)
                    if self._replies:  # other threads' replies: their waiters take them now
                        self._cond.notify_all()
                    if mine is not None:
                        return mine
                    if self.broken is not None:
                        raise LaneBroken(f"lane broken: {self.broken}")
        except TimeoutError:  # an OSError too, but the connection is fine
            raise
        except OSError as e:
            if not isinstance(e, LaneBroken):
                self._break(e)
                raise LaneBroken(f"lane read failed: {e}") from e
            raise
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()

    def may_have(self, rid: int) -> bool:
        """Whether ``wait(rid, now)`` could find anything now (a cheap look for a caller
        that only asks ``done()``): False only when the reply is not filed, nothing is
        buffered or held, the socket has nothing to read, the connection serves, and no
        reply is overdue (so that ``wait`` still detects a lost host when asked). One
        ``select`` with no timeout (its own: the reader's poller is not shared)."""
        if rid in self._replies or self._buf or self._held or self.broken is not None:
            return True
        due = self._next_due()
        if due is not None and time.monotonic() >= due:
            return True
        try:
            readable, _, _ = select.select((self._fd,), (), (), 0)
        except (OSError, ValueError):  # closed meanwhile, or an fd past select's limit: the full path
            return True
        return bool(readable)

    def _next_due(self) -> float | None:
        """When the earliest reply not read yet is overdue (None: none awaited)."""
        with self._due_lock:
            return min(self._due.values(), default=None)

    def forget(self, rid: int) -> None:
        """Nobody waits for request ``rid`` any more: drop its reply (now or when it comes)."""
        with self._cond:
            if self._replies.pop(rid, None) is None and self.broken is None:
                self._unwanted.add(rid)

    def _read_frames(self, deadline: float | None) -> list[tuple[int, int, bytes]]:
        """At least one whole frame, reading until ``deadline`` (then ``TimeoutError``);
        every whole frame read. A reply overdue (see the module docstring) raises
        :class:`LaneBroken`. Only the reader calls it (no lock: ``_buf`` is its own)."""
        buf = self._buf
        while True:
            frames = _split_frames(buf)
            if frames:
                return frames
            try:
                chunk = self._sock.recv(max(1 << 16, _missing(buf)))
            except (BlockingIOError, InterruptedError):
                now = time.monotonic()
                overdue = self._next_due()
                if overdue is not None and now >= overdue:
                    lost = LaneBroken(f"no answer from the actor's host {self._loss_s:g} s past its due: "
                                      "taken as lost")
                    self._break(lost)
                    raise lost from None
                left = None if deadline is None else deadline - now
                if left is not None and left <= 0:
                    raise TimeoutError("lane: no reply yet") from None
                if overdue is not None:
                    left = overdue - now if left is None else min(left, overdue - now)
                _wait(self._poll_in, left)
                continue
            if not chunk:
                raise ConnectionResetError(errno.ECONNRESET, "the actor's side closed the lane")
            buf += chunk

    # -- lifecycle --------------------------------------------------------------------------

    def _break(self, error: BaseException) -> None:
        with self._cond:
            self._break_locked(error)

    def _break_locked(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = error  # replies read already stay: their waiters take them
            self._cond.notify_all()

    def close(self) -> None:
        """Close the socket (in the process that made it; a forked child's copy is only
        dropped). Calls in flight go through Dask."""
        self._break(LaneBroken("closed"))
        if os.getpid() == self.pid:
            try:
                # Wakes a reader blocked in poll() on it (close alone would not), which then
                # finds the connection broken.
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()

    def __del__(self) -> None:  # a handle dropped without its pool's close (an attached one)
        try:
            if os.getpid() == self.pid:
                self._sock.close()
        except Exception:  # at interpreter exit
            pass


def _poller(fd: int, events: int) -> Any:
    poller = select.poll()
    poller.register(fd, events)
    return poller


def _wait(poller: Any, timeout_s: float | None) -> None:
    """Wait up to ``timeout_s`` (None: no limit) for the poller's events."""
    poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000) + 1))


def _missing(buf: bytearray) -> int:
    """How many bytes the frame at the front of ``buf`` still lacks (0: unknown or none),
    so that a big answer is read in a few large reads."""
    if len(buf) < HEADER.size:
        return 0
    return HEADER.size + HEADER.unpack_from(buf)[0] - len(buf)


def _split_frames(buf: bytearray) -> list[tuple[int, int, bytes]]:
    """Cut the whole frames off the front of ``buf``."""
    frames = []
    pos, size, head = 0, len(buf), HEADER.size
    with memoryview(buf) as view:  # one copy per body (a bytearray slice would make two)
        while size - pos >= head:
            length, rid, status = HEADER.unpack_from(buf, pos)
            if length > MAX_FRAME_BYTES:
                raise ConnectionResetError(errno.EPROTO, f"lane frame of {length} bytes")
            if size - pos - head < length:
                break
            frames.append((rid, status, bytes(view[pos + head : pos + head + length])))
            pos += head + length
    if pos:
        del buf[:pos]
    return frames
