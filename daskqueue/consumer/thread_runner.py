"""Running a consumer's batches on its own thread pools, in the worker process.

The run path of ``isolation="thread"`` (and of a consumer whose child process could not
start): :class:`ThreadRunner` owns the general and reserved thread pools, runs a batch on
one of their threads, and watches batches whose items have time limits. The fetch loops,
the run slots and the settlements stay in :mod:`daskqueue.consumer.running`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from daskqueue import defaults
from daskqueue.consumer.batch import Batch, Outcome, dump_results
from daskqueue.consumer.limits import watchdog

__all__ = ["Abandoned", "ThreadRunner"]

logger = logging.getLogger("daskqueue")

RunOnThread = Callable[[Batch], "tuple[Outcome, float]"]


class Abandoned(Exception):
    """A batch left to a thread that ignored its time limit (see ``ThreadRunner.run``)."""


class ThreadRunner:
    """Runs batches on ``max_concurrency`` general threads and ``reserved_slots`` reserved
    ones (threads of their own: a batch fetched ahead waits for a general thread and can
    never take a reserved one). Event-loop only, except ``run_on_thread``, which runs on a
    run thread. Its caller runs at most as many batches of a kind at once as it has threads.
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

    async def run(self, batch: Batch) -> tuple[Outcome, float]:
        """Run ``batch`` on a thread of its kind; raises :class:`Abandoned` if one of its
        items ignored its time limit (its thread is left behind)."""
        loop = asyncio.get_running_loop()
        executor = self._reserved_executor if batch.reserved else self._executor
        running = loop.run_in_executor(executor, self._on_thread, batch)
        if not any(seg.time_limit_s for seg in batch.segments):
            return await running
        return await self._run_watched(batch, running)

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

    async def _run_watched(self, batch: Batch, running: asyncio.Future[Any]) -> tuple[Outcome, float]:
        """Await a batch with time limits; if an item ignores its interruption for
        ``TIME_LIMIT_GRACE_S``, leave its thread behind: raise :class:`Abandoned` (the batch
        is not settled and its lease no longer extended, so the queue redelivers it), and run
        later batches on fresh threads so that the slot is not lost."""
        while True:
            done, _ = await asyncio.wait({running}, timeout=min(1.0, defaults.TIME_LIMIT_GRACE_S / 5))
            if done:
                return running.result()
            thread = self._batch_threads.get(batch.lease_id)
            if thread is not None and watchdog.overdue_s(thread) > defaults.TIME_LIMIT_GRACE_S:
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
        raise Abandoned(batch.lease_id)
