"""Running a consumer's batches on its own thread pools, in the worker process.

The run path of ``isolation="thread"`` (and of a consumer whose child process could not
start): :class:`ThreadRunner` owns the general and reserved thread pools, runs a batch on
one of their threads, and watches batches whose items have time limits. The fetch loops,
the run slots and the settlements stay in :mod:`daskqueue.consumer.running`.

As in the child process, a batch handed over while every thread of its kind runs waits at
a :class:`~daskqueue.consumer.start_gate.StartGate`: the thread whose batch ends next runs
it there and then, with no round trip to the event loop, unless it was taken back
(``take_back``) or is past its latest start; then it comes back unrun (``NotStarted``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from daskqueue import defaults
from daskqueue.consumer.batch import Batch, Outcome, dump_results
from daskqueue.consumer.limits import watchdog
from daskqueue.consumer.start_gate import Arrival, NotStarted, StartGate, Waiting

__all__ = ["Abandoned", "ThreadRunner"]

logger = logging.getLogger("daskqueue")

RunOnThread = Callable[[Batch], "tuple[Outcome, float]"]


class Abandoned(Exception):
    """A batch left to a thread that ignored its time limit (see ``ThreadRunner.run``)."""


class ThreadRunner:
    """Runs batches on ``max_concurrency`` general threads and ``reserved_slots`` reserved
    ones (threads of their own: a batch fetched ahead waits for a general thread and can
    never take a reserved one). Event-loop only, except ``run_on_thread`` and the gate's
    hand-over (``_serve``), on the run threads.
    """

    def __init__(self, index: int, max_concurrency: int, reserved_slots: int, run_on_thread: RunOnThread) -> None:
        self.index = index
        self._max_concurrency = max_concurrency
        self._reserved_slots = reserved_slots
        self._run_on_thread = run_on_thread
        self._executor: ThreadPoolExecutor | None = None
        self._reserved_executor: ThreadPoolExecutor | None = None
        self._batch_threads: dict[int, int] = {}  # lease id -> the thread running it
        self.abandoned = 0  # batches left to a thread that ignored its time limit
        self._gate = StartGate(max_concurrency, reserved_slots)
        self._gate_lock = threading.Lock()  # the event loop and the run threads share the gate
        self._keys = itertools.count()
        self._running: set[int] = set()  # keys of the batches holding a slot (under the lock)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Make the thread pools (kept across a stop and a start)."""
        if self._executor is None:
            self._executor = self._new_executor(reserved=False)
        if self._reserved_executor is None and self._reserved_slots:
            self._reserved_executor = self._new_executor(reserved=True)

    def shutdown(self) -> None:
        """Shut the thread pools down (threads running an item finish it)."""
        for executor in (self._executor, self._reserved_executor):
            if executor is not None:
                executor.shutdown(wait=False)
        self._executor = self._reserved_executor = None

    def _new_executor(self, *, reserved: bool) -> ThreadPoolExecutor:
        if reserved:
            return ThreadPoolExecutor(self._reserved_slots, thread_name_prefix=f"daskqueue-consumer-{self.index}-reserved")
        return ThreadPoolExecutor(self._max_concurrency, thread_name_prefix=f"daskqueue-consumer-{self.index}")

    async def run(self, batch: Batch, start_by: float | None = None) -> tuple[Outcome, float]:
        """Run ``batch`` on a thread of its kind, at once or when one frees; raises
        :class:`~daskqueue.consumer.start_gate.NotStarted` if it was taken back or is past
        ``start_by`` (epoch s) first, :class:`Abandoned` if one of its items ignored its time
        limit (its thread is left behind)."""
        self._loop = loop = asyncio.get_running_loop()
        running: asyncio.Future[tuple[Outcome, float]] = loop.create_future()
        request = Waiting(next(self._keys), (batch, running), reserved=batch.reserved, start_by=start_by)
        with self._gate_lock:
            arrival = self._gate.arrive(request, time.time())
            if arrival is Arrival.START:
                self._running.add(request.key)
        if arrival is Arrival.REFUSE:
            raise NotStarted(late=True)
        if arrival is Arrival.START:
            try:
                self._executor_of(batch).submit(self._serve, request)
            except BaseException:
                if self._detach(request):  # never started: its slot must not stay taken
                    self._hand_on(request)
                raise
        if not any(seg.time_limit_s for seg in batch.segments):
            return await running
        return await self._run_watched(request, running)

    def take_back(self) -> None:
        """Every batch still waiting for a thread comes back unrun (its ``run`` raises
        ``NotStarted``); those running run on. Event loop only."""
        with self._gate_lock:
            taken = self._gate.take_back()
        for request in taken:
            _resolve(request.item[1], None, NotStarted(late=False))

    def _executor_of(self, batch: Batch) -> ThreadPoolExecutor:
        executor = self._reserved_executor if batch.reserved else self._executor
        if executor is None:
            raise RuntimeError("the consumer's thread pools are shut down")
        return executor

    def _serve(self, request: Waiting | None) -> None:
        """On a run thread: run ``request``, then each batch the gate hands this thread as
        its slot frees; answer each on the event loop."""
        loop = self._loop
        assert loop is not None
        while request is not None:
            batch, running = request.item
            try:
                answer, error = self._on_thread(batch), None
            except BaseException as e:  # the batch's awaiter gets it, as from run_in_executor
                answer, error = None, e
            loop.call_soon_threadsafe(_resolve, running, answer, error)
            with self._gate_lock:
                if request.key not in self._running:  # left here: its slot was handed on then
                    return
                self._running.discard(request.key)
                request, late = self._gate.finished(request.reserved, time.time())
                if request is not None:
                    self._running.add(request.key)
            for refused in late:
                loop.call_soon_threadsafe(_resolve, refused.item[1], None, NotStarted(late=True))

    def _on_thread(self, batch: Batch) -> tuple[Outcome, float]:
        """On a run thread: run ``batch`` (known as this thread's to the time-limit watch),
        then pickle its results here: they may be large, and pickling them on the event
        loop would stall the worker's loop, its heartbeats and every actor on it."""
        self._batch_threads[batch.lease_id] = threading.get_ident()
        try:
            outcome, run_s = self._run_on_thread(batch)
        finally:
            self._batch_threads.pop(batch.lease_id, None)
        dump_results(outcome)
        return outcome, run_s

    async def _run_watched(self, request: Waiting, running: asyncio.Future[Any]) -> tuple[Outcome, float]:
        """Await a batch with time limits; if an item ignores its interruption for
        ``TIME_LIMIT_GRACE_S``, leave its thread behind: raise :class:`Abandoned` (the batch
        is not settled and its lease no longer extended, so the queue redelivers it), and run
        later batches on fresh threads so that the slot is not lost."""
        batch = request.item[0]
        while True:
            done, _ = await asyncio.wait({running}, timeout=min(1.0, defaults.TIME_LIMIT_GRACE_S / 5))
            if done:
                return running.result()
            thread = self._batch_threads.get(batch.lease_id)
            if thread is not None and watchdog.overdue_s(thread) > defaults.TIME_LIMIT_GRACE_S:
                # Unless the batch ended meanwhile (its thread gave the slot back itself).
                if self._detach(request):
                    break
        self.abandoned += 1
        logger.error("consumer %d: an item of lease %d ignored its time limit for %g s (a C call, or "
                     "it caught the exception); leaving its thread behind, its lease to expire",
                     self.index, batch.lease_id, defaults.TIME_LIMIT_GRACE_S)
        if batch.reserved:
            old, self._reserved_executor = self._reserved_executor, self._new_executor(reserved=True)
        else:
            old, self._executor = self._executor, self._new_executor(reserved=False)
        if old is not None:
            old.shutdown(wait=False)
        self._hand_on(request)  # its slot goes on to the next waiting batch, on a fresh thread
        raise Abandoned(batch.lease_id)

    def _detach(self, request: Waiting) -> bool:
        """Take ``request``'s slot from its thread (True), unless that thread gave it back
        already (False): a detached thread ends with its batch, giving back nothing."""
        with self._gate_lock:
            if request.key not in self._running:
                return False
            self._running.discard(request.key)
            return True

    def _hand_on(self, request: Waiting) -> None:
        """On the event loop: the slot of ``request`` (detached) goes to the next waiting
        batch, which starts on a thread of its own."""
        with self._gate_lock:
            following, late = self._gate.finished(request.reserved, time.time())
            if following is not None:
                self._running.add(following.key)
        for refused in late:
            _resolve(refused.item[1], None, NotStarted(late=True))
        if following is not None:
            try:
                self._executor_of(following.item[0]).submit(self._serve, following)
            except BaseException as e:
                _resolve(following.item[1], None, e)
                if self._detach(following):
                    self._hand_on(following)


def _resolve(running: asyncio.Future[Any], answer: Any, error: BaseException | None) -> None:
    """On the event loop: answer a batch's awaiter (once: a batch left to its thread may
    still end)."""
    if running.done():
        return
    if error is not None:
        running.set_exception(error)
    else:
        running.set_result(answer)
