"""Running a consumer's batches in a child process, so a task that kills its process kills
only that process, never the worker and the queue actor that share it.

A consumer whose worker also holds a queue (``isolation="auto"``, the default) runs its
batches through a :class:`ProcessRunner`: one child process (``daskqueue.consumer.child``)
with ``max_concurrency`` threads, fed batches through a pipe. The fetch loop, the leases and
the settlements stay in the actor on the worker's event loop.

When the child dies while batches run in it, which item killed it is unknown (the child
reports no per-item progress on the fast path). Each of those batches is then run again,
alone, in a fresh child that reports the start of every item: if that child dies too, the
item it had started is the killer. It is not run again in this batch: it fails with a
:class:`~daskqueue.errors.KilledWorkerError` error (an attempt, so the queue retries it,
elsewhere if another consumer takes it, and dead-letters it after ``max_retries``), and the
batch's other items run in the next child. The items that ran before a death run again
(delivery is at-least-once); every other message of the batch gets its result.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from daskqueue.consumer.batch import batch_to_child
from daskqueue.consumer.child import FRAME, encode_frame
from daskqueue.consumer.child_functions import ChildFunctions
from daskqueue.consumer.start_gate import NotStarted
from daskqueue.defaults import TIME_LIMIT_GRACE_S
from daskqueue.messages import decode_error, encode_error, killed_error

__all__ = ["ProcessRunner", "ChildDied", "ChildFunctions", "child_killed_error"]

#: What the child process runs.
CHILD_MAIN = "from daskqueue.consumer.child import main; main()"

logger = logging.getLogger("daskqueue")

#: How long a child may take to start (import daskqueue, build the consumer twin).
CHILD_START_TIMEOUT_S = 60.0

#: How long ``close`` waits for a child to exit after its input is closed, before killing it.
CHILD_EXIT_TIMEOUT_S = 5.0

#: The most read from the child's output pipe per round of the loop.
READ_BYTES = 1 << 20

def child_killed_error(returncode: int | None) -> bytes:
    """The error recorded for a message whose run killed its child process."""
    how = f"exit code {returncode}" if returncode is None or returncode >= 0 else f"signal {-returncode}"
    return killed_error(f"the process running this message died ({how})")


class ChildDied(Exception):
    """The child process ended while running a batch; ``last_started`` is the position of the
    item it had started last (when it was reporting starts), else None."""

    def __init__(self, returncode: int | None, last_started: int | None, timed_out: bool = False) -> None:
        super().__init__(f"child process died with return code {returncode}")
        self.returncode = returncode
        self.last_started = last_started
        self.timed_out = timed_out  # killed by its runner: an item ran past its time limit


@dataclass(eq=False)
class _Request:
    future: asyncio.Future[tuple[Any, ...]]
    last_started: int | None = None


@dataclass(eq=False)
class _Child:
    proc: asyncio.subprocess.Process
    fd: int  # the read end of the child's output pipe (non-blocking), -1 once closed
    #: The child's first frame (``ready`` or ``init-failed``; None if it ended before one).
    greeting: asyncio.Future[Any]
    #: Made when the child's output ends: waits for its exit and fails what it still ran.
    reader: asyncio.Task[None] | None = None
    requests: dict[int, _Request] = field(default_factory=dict)
    sent_funcs: ChildFunctions = field(default_factory=ChildFunctions)
    timed_out: bool = False  # killed because an item ignored its time limit
    received: bytearray = field(default_factory=bytearray)  # output read, not yet a whole frame


class ProcessRunner:
    """Runs batches in a child process; restarts it when it dies. Event-loop only.

    ``spec`` is the cloudpickled ``(ConsumerClass, args, kwargs)`` that builds the consumer's
    twin in the child. ``run`` returns ``(done, errors, fatal, results_blob, run_s)``.
    """

    def __init__(self, spec: bytes, index: int) -> None:
        self._spec = spec
        self.index = index
        self._child: _Child | None = None
        self._spawning: asyncio.Lock | None = None
        self._recovering: asyncio.Lock | None = None
        self._ids = itertools.count()
        self._halt = False
        self.deaths = 0

    def __repr__(self) -> str:
        pid = None if self._child is None else self._child.proc.pid
        return f"<ProcessRunner of consumer {self.index}: child pid {pid}, {self.deaths} deaths>"

    @property
    def child_functions(self) -> int:
        """How many functions the child holds now (0 without a child)."""
        return 0 if self._child is None else len(self._child.sent_funcs)

    # -- the child's lifetime -----------------------------------------------------------------

    async def start(self) -> None:
        """Start the child now (``run`` would start it on first use)."""
        await self._ensure()

    async def _ensure(self) -> _Child:
        if self._spawning is None:
            self._spawning, self._recovering = asyncio.Lock(), asyncio.Lock()
        async with self._spawning:
            if self._child is None:
                child = await asyncio.wait_for(self._spawn(), CHILD_START_TIMEOUT_S)
                self._child = child
                # The flag as it is now (a set_halt during the spawn found no child to tell).
                await self._send(child, ("halt", self._halt))
            return self._child

    async def _spawn(self) -> _Child:
        # The child imports what this worker can (a task function pickled by reference to a
        # module on a path added at run time, e.g. by pytest): it gets the worker's sys.path.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        # Its output is a pipe of our own, read by a callback of the loop (see _readable):
        # a reply reaches the batch waiting for it in two rounds of the loop, where asyncio's
        # subprocess streams take four (transport, protocol, reader task, then the waiter).
        out_r, out_w = os.pipe()
        try:
            # ``-c``, not ``-m``: the package imports ``child`` itself, so ``-m`` would run a
            # second copy of it as ``__main__`` (and print runpy's RuntimeWarning on every start).
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CHILD_MAIN, stdin=asyncio.subprocess.PIPE, stdout=out_w, env=env,
            )
        except BaseException:
            os.close(out_r)
            raise
        finally:
            os.close(out_w)
        os.set_blocking(out_r, False)
        loop = asyncio.get_running_loop()
        child = _Child(proc, out_r, loop.create_future())
        loop.add_reader(out_r, self._readable, child)
        try:
            await self._send(child, ("init", self._spec))
            reply = await child.greeting
        except BaseException:
            proc.kill()
            self._stop_reading(child)
            raise
        if reply is None or reply[0] != "ready":
            await proc.wait()
            self._stop_reading(child)
            await child.reader  # type: ignore[misc]
            raise RuntimeError(self._init_failure(reply, proc.returncode))
        logger.debug("consumer %d: child process %d started", self.index, proc.pid)
        return child

    @staticmethod
    def _init_failure(reply: Any, returncode: int | None) -> str:
        if reply is not None and reply[0] == "init-failed":
            exc_type, message, _ = decode_error(reply[1])
            return f"the consumer cannot be built in a child process: {exc_type}: {message}"
        return f"the child process exited while starting (return code {returncode})"

    async def close(self) -> None:
        """End the child: close its input, wait a little, kill it if it is still there."""
        child, self._child = self._child, None
        if child is None:
            return
        try:
            child.proc.stdin.close()  # type: ignore[union-attr]
            await asyncio.wait_for(child.proc.wait(), CHILD_EXIT_TIMEOUT_S)
        except (asyncio.TimeoutError, OSError):
            child.proc.kill()
            await child.proc.wait()
        self._stop_reading(child)  # its output may not have been seen to end yet
        assert child.reader is not None
        await child.reader

    async def set_halt(self, flag: bool) -> None:
        """Make the child's run threads stop (or not) at the next item boundary."""
        self._halt = flag
        if self._child is not None:
            try:
                await self._send(self._child, ("halt", flag))
            except (OSError, ConnectionError):
                pass  # it died; the next child gets the flag when it starts

    # -- frames -------------------------------------------------------------------------------

    @staticmethod
    async def _send(child: _Child, obj: Any) -> None:
        stdin = child.proc.stdin
        assert stdin is not None
        stdin.write(encode_frame(obj))
        await stdin.drain()

    def _readable(self, child: _Child) -> None:
        """The child's output pipe has data (or ended): hand each whole frame to its request;
        at its end (the child died, or its pipe broke), fail what it still ran."""
        try:
            data = os.read(child.fd, READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._stop_reading(child)
            return
        buf = child.received
        buf += data
        try:
            used = 0
            while len(buf) - used >= FRAME.size:
                (size,) = FRAME.unpack_from(buf, used)
                if len(buf) - used - FRAME.size < size:
                    break
                msg = pickle.loads(memoryview(buf)[used + FRAME.size:used + FRAME.size + size])
                used += FRAME.size + size
                self._dispatch(child, msg)
            del buf[:used]
        except Exception:
            logger.exception("consumer %d: reading from the child process failed; ending it", self.index)
            child.proc.kill()
            self._stop_reading(child)

    def _dispatch(self, child: _Child, msg: Any) -> None:
        if msg[0] in ("ready", "init-failed"):
            if not child.greeting.done():
                child.greeting.set_result(msg)
            return
        request = child.requests.get(msg[1])
        if request is None:
            return
        if msg[0] == "started":
            request.last_started = msg[2]
        elif msg[0] == "done":
            del child.requests[msg[1]]
            if not request.future.done():
                request.future.set_result(msg[2:])
        elif msg[0] == "unrun":
            del child.requests[msg[1]]
            if not request.future.done():
                request.future.set_exception(NotStarted(late=msg[2]))

    def _stop_reading(self, child: _Child) -> None:
        """Stop reading the child's output (idempotent) and start ``_ended``."""
        if child.fd < 0:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(child.fd)
        os.close(child.fd)
        child.fd = -1
        if not child.greeting.done():
            child.greeting.set_result(None)
        child.reader = loop.create_task(self._ended(child))

    async def _ended(self, child: _Child) -> None:
        """The child's output ended: wait for its exit, then fail what it still ran."""
        returncode = await child.proc.wait()
        if self._child is child:
            self._child = None
            self.deaths += 1
            logger.warning("consumer %d: its child process died (return code %s) with %d batches "
                           "in it", self.index, returncode, len(child.requests))
        for request in child.requests.values():
            if not request.future.done():
                request.future.set_exception(ChildDied(returncode, request.last_started, child.timed_out))
        child.requests.clear()

    # -- running ------------------------------------------------------------------------------

    async def run(self, batch: Any, funcs: dict[bytes, bytes], start_by: float | None = None) -> tuple[Any, ...]:
        """Run ``batch`` in the child; ``funcs`` holds every function it may need, by digest.
        Sent at once: the child starts it when a run thread frees, unless ``take_back`` came
        first or it is past ``start_by`` (epoch s): then it raises ``NotStarted``, nothing ran."""
        await self._ensure()
        assert self._recovering is not None
        if not self._recovering.locked():
            try:
                return await self._run_once(batch, funcs, report_starts=False, skip={}, start_by=start_by)
            except ChildDied:
                pass
        async with self._recovering:  # batches from a dead child are retried one at a time
            return await self._recover(batch, funcs, start_by)

    def take_back(self) -> None:
        """Have the child send back unrun every batch waiting for a run thread there (their
        ``run`` raises ``NotStarted``; running ones run on). No wait: the transport buffers it."""
        child = self._child
        if child is None or child.proc.stdin is None:
            return
        try:
            child.proc.stdin.write(encode_frame(("take-back",)))
        except (OSError, ConnectionError):
            pass  # it died: its reader fails what it held

    async def _recover(self, batch: Any, funcs: dict[bytes, bytes], start_by: float | None) -> tuple[Any, ...]:
        skip: dict[int, bytes] = {}
        while len(skip) < batch.count:
            try:
                return await self._run_once(batch, funcs, report_starts=True, skip=skip, start_by=start_by)
            except ChildDied as e:
                killer = e.last_started
                if killer is None:  # it died before any item started: blame the first
                    killer = min(p for p in range(batch.count) if p not in skip)
                if e.timed_out:
                    logger.warning("consumer %d: the item at position %d of lease %d ran past its time "
                                   "limit and did not stop; failing it", self.index, killer, batch.lease_id)
                    skip[killer] = time_limit_error(batch, killer)
                    continue
                logger.warning("consumer %d: the item at position %d of lease %d killed its "
                               "process; failing it", self.index, killer, batch.lease_id)
                skip[killer] = child_killed_error(e.returncode)
        return batch.count, skip, set(), pickle.dumps([None] * batch.count), 0.0

    async def _run_once(self, batch: Any, funcs: dict[bytes, bytes], *, report_starts: bool,
                        skip: dict[int, bytes], start_by: float | None) -> tuple[Any, ...]:
        child = await self._ensure()
        # Planned and written with no await between: run messages reach the child in the order
        # their plans were made (see ChildFunctions).
        needed, drop = child.sent_funcs.plan(_digests(batch), funcs)
        allowance = _allowance(batch, skip)
        # A batch with time limits reports its items' starts: its allowance counts from the
        # first one (not from the consumer's setup, which the first batch runs first).
        report_starts = report_starts or allowance is not None
        request_id = next(self._ids)
        request = child.requests[request_id] = _Request(asyncio.get_running_loop().create_future())
        try:
            await self._send(child, ("run", request_id, batch_to_child(batch), needed, drop, report_starts, skip,
                                     start_by))
        except (OSError, ConnectionError):
            pass  # the child is dying: its reader fails the request
        if child.reader is not None and child.reader.done() and not request.future.done():
            request.future.set_exception(ChildDied(child.proc.returncode, None))  # died before
        if allowance is not None:
            started_at = None
            while not request.future.done():
                await asyncio.wait({request.future}, timeout=0.2)
                if started_at is None and request.last_started is not None:
                    started_at = time.monotonic()
                if started_at is not None and time.monotonic() - started_at > allowance:
                    break
            if not request.future.done() and child.proc.returncode is None:
                # An item ignored its interruption (a C call, or it caught the exception):
                # the child's slot would be held for good. End the child; the batch is rerun
                # item by item and the item that hangs is failed (see _recover).
                logger.warning("consumer %d: lease %d ran %g s past its items' time limits; killing "
                               "its child process", self.index, batch.lease_id, TIME_LIMIT_GRACE_S)
                child.timed_out = True
                child.proc.kill()
        return await request.future


def _allowance(batch: Any, skip: dict[int, bytes]) -> float | None:
    """The longest a batch may run when every item has a time limit: their sum (the child's
    watchdog interrupts each one) plus ``TIME_LIMIT_GRACE_S``; None if any item has none."""
    total = 0.0
    pos = 0
    for seg in batch.segments:
        limit = getattr(seg, "time_limit_s", 0.0)
        if not limit:
            return None
        total += limit * sum(1 for p in range(pos, pos + seg.count) if p not in skip)
        pos += seg.count
    return total + TIME_LIMIT_GRACE_S


def time_limit_error(batch: Any, position: int) -> bytes:
    """The error of an item that ran past its time limit and could not be interrupted."""
    limit = 0.0
    pos = 0
    for seg in batch.segments:
        if position < pos + seg.count:
            limit = getattr(seg, "time_limit_s", 0.0)
            break
        pos += seg.count
    name = "daskqueue.errors.TimeLimitExceeded"
    text = (f"the task ran past its time limit of {limit:g} s and did not stop when interrupted "
            f"(a C call, or it caught the exception): its process was killed {TIME_LIMIT_GRACE_S:g} s later")
    return encode_error(name, text, f"{name}: {text}\n")


def _digests(batch: Any) -> set[bytes]:
    return {s.digest for s in batch.segments if s.digest is not None}
