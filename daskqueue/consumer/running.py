"""Running a consumer's batches: the fetch loops and the run slots.

Backpressure: at most ``max_concurrency + prefetch_batches`` fetched batches exist at once;
a fetch loop fetches the next only when one of those slots frees up. Reserved slots have a
fetch loop, a semaphore and threads of their own. A batch runs on the consumer's own thread
pool (``daskqueue.consumer.thread_runner``) or in its child process
(``daskqueue.consumer.isolate``), and is settled when it ends; a batch whose item ignores
its time limit is left to its thread. The fetch loops are on the event loop and never run
user code.

A batch fetched ahead goes to its runner at once (the child process, or the thread pool)
and waits there for a run thread at a gate (``daskqueue.consumer.start_gate``): a thread
that frees starts the next batch with no round trip to this loop, and the walltime guard
and a stopping consumer still have their say (a batch past its latest start, or taken
back, comes back unrun and is given back). Early acks only wait here for a run thread: the
ack must be answered before the batch starts.

Walltime: on a worker that will leave (``--lifetime``, a SLURM job's end; see
``daskqueue.consumer.leaving``), the fetch loops take only what the
:class:`~daskqueue.consumer.walltime.WalltimeGuard` says still ends in time, and a fetched
batch that no longer does when it is about to start is given back unrun (in the child: past
the latest start the batch was sent with).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from daskqueue import defaults
from daskqueue.consumer.batch import Batch, Outcome
from daskqueue.consumer.counters import Counters
from daskqueue.consumer.eager import start_eagerly
from daskqueue.consumer.fetching import FetchPolicy
from daskqueue.consumer.isolate import time_limit_error
from daskqueue.consumer.settling import Settler
from daskqueue.consumer.sizer import BatchSizer
from daskqueue.consumer.start_gate import NotStarted
from daskqueue.consumer.thread_runner import Abandoned, RunOnThread, ThreadRunner
from daskqueue.consumer.walltime_watch import WalltimeWatch
from daskqueue.queue.handles import ORPHAN_CHECK_S

__all__ = ["RunSlots", "SlotConfig"]

logger = logging.getLogger("daskqueue")

#: How long a fetch loop waits before asking again when the walltime lets it take nothing.
WALLTIME_WAIT_S = 0.2


@dataclass(frozen=True, slots=True)
class SlotConfig:
    """How many batches a consumer runs and holds at once, and when it acks them."""

    max_concurrency: int  # general run slots, one thread each
    prefetch_batches: int  # batches fetched ahead of a free general slot
    reserved_slots: int  # slots (and threads) for urgent work only
    early_ack: bool  # ack a batch before it runs (at-most-once)


class RunSlots:
    """Fetches batches while a slot is free, runs each, settles it. Event-loop only, except
    the function each batch runs (``run_on_thread``, on a run thread).

    ``orphaned()`` is asked every ``ORPHAN_CHECK_S``; when it says so, ``close_orphan()`` is
    called and the general fetch loop ends. ``process`` is the child-process runner while
    batches run in a child process (set by the consumer), else None.
    """

    def __init__(self, index: int, config: SlotConfig, fetcher: FetchPolicy, settler: Settler,
                 sizer: BatchSizer, counters: Counters, *, run_on_thread: RunOnThread,
                 orphaned: Callable[[], bool],
                 close_orphan: Callable[[], None]) -> None:
        self.index = index
        self.config = config
        self._fetcher = fetcher
        self._settler = settler
        self._sizer = sizer
        self._counters = counters
        self._thread_runner = ThreadRunner(index, config.max_concurrency, config.reserved_slots, run_on_thread)
        self._orphaned = orphaned
        self._close_orphan = close_orphan
        self.process: Any = None
        self.inflight: dict[tuple[int, int], Batch] = {}  # (slot, lease_id) -> batch
        self._stop_requested = False
        self._stopping = asyncio.Event()  # set with stop_requested: wakes batches waiting for a thread
        self.loop_task: asyncio.Task[None] | None = None
        self._reserved_task: asyncio.Task[None] | None = None
        self._extender: asyncio.Task[None] | None = None
        self._finishing: set[asyncio.Task[None]] = set()
        self._sent_ahead = 0  # general batches sent to the runner and not back yet
        # One per run thread, for early acks (see _run_here).
        self._threads = asyncio.Semaphore(config.max_concurrency)
        self._threads_reserved = asyncio.Semaphore(max(1, config.reserved_slots))
        self.walltime = WalltimeWatch(index)

    @property
    def abandoned(self) -> int:
        """Batches left to a thread that ignored its time limit."""
        return self._thread_runner.abandoned

    @property
    def stop_requested(self) -> bool:
        """Set to stop the fetch loops; batches fetched ahead that have no run thread yet
        are then given back unrun at once (see ``_run_and_settle``), also those waiting in
        the child process."""
        return self._stop_requested

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        self._stop_requested = value
        if value:
            self._stopping.set()
            self._thread_runner.take_back()
            if self.process is not None:
                self.process.take_back()
        else:
            self._stopping = asyncio.Event()

    def held(self) -> list[tuple[int, int]]:
        """The ``(slot, lease_id)`` of every batch fetched and not settled yet."""
        return list(self.inflight)

    def start(self) -> None:
        """Start the fetch loops (and the lease extender unless batches are acked early)."""
        self.stop_requested = False
        self._thread_runner.start()
        loop = asyncio.get_running_loop()
        self.loop_task = loop.create_task(self._fetch_loop(look_up_leaving=True))
        if self.config.reserved_slots:
            self._reserved_task = loop.create_task(self._fetch_loop(reserved=True))
        if not self.config.early_ack:
            self._extender = loop.create_task(self._settler.extend_forever())

    async def join(self) -> None:
        """After ``stop_requested`` is set: await the fetch loops, then every settlement,
        then stop extending leases (an unsettled lease must stay alive until its settlement
        has been answered)."""
        if self.loop_task is not None:
            await self.loop_task
            self.loop_task = None
        if self._reserved_task is not None:
            await self._reserved_task
            self._reserved_task = None
        while self._finishing:
            await asyncio.gather(*list(self._finishing))
        if self._extender is not None:
            self._extender.cancel()
            try:
                await self._extender
            except asyncio.CancelledError:
                pass
            except Exception:  # it already logged; stopping must not fail because of it
                logger.exception("consumer %d: the lease extender had failed", self.index)
            self._extender = None

    def shutdown(self) -> None:
        """Shut the thread pools down (threads running an item finish it)."""
        self._thread_runner.shutdown()

    async def _fetch_loop(self, reserved: bool = False, look_up_leaving: bool = False) -> None:
        """Fetch and start batches while there is a free slot: the general slots (and the
        prefetch), or with ``reserved`` the reserved slots (urgent work, one message per
        batch), as much as the walltime allows. The general loop also closes an orphaned
        consumer, and first looks up when the worker leaves (``look_up_leaving``)."""
        c = self.config
        slots = asyncio.Semaphore(c.reserved_slots if reserved else c.max_concurrency + c.prefetch_batches)
        if look_up_leaving:
            await self.walltime.look_up()
        checked_at = time.monotonic()
        while not self.stop_requested:
            if not reserved and time.monotonic() - checked_at > ORPHAN_CHECK_S:
                checked_at = time.monotonic()
                if self._orphaned():
                    self._close_orphan()
                    return
            await slots.acquire()
            limit = self._fetch_limit(reserved)
            if limit == 0:
                slots.release()
                await asyncio.sleep(WALLTIME_WAIT_S)
                continue
            try:
                batch = None if self.stop_requested else await self._fetch(reserved, limit)
            except Exception:
                slots.release()
                logger.exception("consumer %d: fetching failed; retrying in %g s", self.index, defaults.FETCH_RETRY_S)
                await asyncio.sleep(defaults.FETCH_RETRY_S)
                continue
            if batch is None:
                slots.release()
                continue
            self.inflight[(batch.queue_slot, batch.lease_id)] = batch
            # Started on this step, not a later one: the batch reaches its run thread (or its
            # child) before anything else on the loop runs, and before the next fetch.
            task = start_eagerly(self._run_and_settle(batch, slots))
            self._finishing.add(task)
            task.add_done_callback(self._finishing.discard)

    async def _fetch(self, reserved: bool, limit: int | None) -> Batch | None:
        if reserved:
            return await self._fetcher.fetch_urgent()
        return await self._fetcher.fetch(limit=limit)

    def _fetch_limit(self, reserved: bool) -> int | None:
        """How many messages the next fetch may take: None (no end known), else the
        walltime guard's say (0: none now)."""
        threads = self.config.reserved_slots if reserved else self.config.max_concurrency
        busy = self._counters.busy_slots  # both kinds of slot: close enough near the end
        return self.walltime.fetch_limit(1 if reserved else self._sizer.size, thread_free=busy < threads)

    async def _run_and_settle(self, batch: Batch, slots: asyncio.Semaphore) -> None:
        try:
            if not self.config.early_ack:
                outcome = await self._run_sent_ahead(batch)
            else:
                outcome = await self._run_here(batch)
            if outcome is None:  # given back unrun
                return
            if self.config.early_ack:
                await self._settler.record(batch, outcome)
            else:
                await self._settler.settle(batch, outcome, early=False)
        except Abandoned:
            # Late ack: not settled, its lease expires and the queue redelivers it (an
            # attempt). Early ack: acked already, so its items fail here, with no result.
            if self.config.early_ack:
                await self._record_abandoned(batch)
        except Exception:
            if self.config.early_ack:  # acked before it ran: nothing brings these outcomes back
                logger.exception("consumer %d: recording the outcomes of early-acked lease %d failed; "
                                 "they are lost", self.index, batch.lease_id)
            else:
                logger.exception("consumer %d: settling lease %d failed; its messages will be "
                                 "redelivered", self.index, batch.lease_id)
        finally:
            del self.inflight[(batch.queue_slot, batch.lease_id)]
            slots.release()

    async def _run_sent_ahead(self, batch: Batch) -> Outcome | None:
        """Hand ``batch`` to its runner now, even with every run thread there busy: it
        starts when one frees, unless the consumer stops first (``stop_requested`` takes it
        back) or it is past its latest start by then; then it comes back unrun and is given
        back (None). Late acks only: an early ack must be answered before the batch starts."""
        if self._stop_requested or self.walltime.too_late(batch):
            await self._give_back(batch, late=not self._stop_requested)
            return None
        self._sent_busy(batch, 1)
        late: bool | None = None
        try:
            outcome, run_s = await self._run(batch, self.walltime.start_by(batch))
        except NotStarted as e:
            late = e.late
        finally:
            self._sent_busy(batch, -1)
        if late is not None:
            await self._give_back(batch, late=late)
            return None
        self._observe(batch, outcome, run_s)
        return outcome

    def _sent_busy(self, batch: Batch, delta: int) -> None:
        """Count a batch sent to its runner (1) or back (-1) in ``busy_slots``: at most
        ``max_concurrency`` general ones run there, the rest wait for a thread."""
        if batch.reserved:  # a reserved slot was free: it runs at once
            self._counters.busy_slots += delta
            return
        most = self.config.max_concurrency
        before = min(self._sent_ahead, most)
        self._sent_ahead += delta
        self._counters.busy_slots += min(self._sent_ahead, most) - before

    async def _run_here(self, batch: Batch) -> Outcome | None:
        """Early acks: run ``batch`` once a run thread is free (counted here), or give it
        back unrun (None) if the consumer stops first or it would end too late."""
        threads = self._threads_reserved if batch.reserved else self._threads
        # Its ack must be answered before it starts, so a batch fetched ahead waits here for
        # a run thread: when it gets one, it is known whether it still ends in time.
        if not await self._thread_unless_stopping(threads):
            # The consumer stops (its worker retires, its pool closes) before this batch
            # started: give it back now, not once the batches running ahead of it end, so
            # that its messages run elsewhere and the consumer leaves sooner.
            await self._give_back(batch, late=False)
            return None
        try:
            if self.walltime.too_late(batch):
                # Before any early ack: unrun, it goes back to the front of its queue with
                # no attempt counted, for a consumer that has the time.
                await self._give_back(batch, late=True)
                return None
            if self.config.early_ack:
                await self._settler.settle(batch, Outcome(batch.count, {}, set(), []), early=True)
            self._counters.busy_slots += 1
            try:
                outcome, run_s = await self._run(batch)
            finally:
                self._counters.busy_slots -= 1
            self._observe(batch, outcome, run_s)
            return outcome
        finally:
            threads.release()

    def _observe(self, batch: Batch, outcome: Outcome, run_s: float) -> None:
        self._counters.observe(outcome.done, run_s)
        self.walltime.observe(outcome.done, run_s, (s.type for s in batch.segments))
        if not batch.reserved:
            self._sizer.observe(outcome.done, run_s, (s.type for s in batch.segments))

    async def _give_back(self, batch: Batch, *, late: bool) -> None:
        """Give ``batch`` back to its queue unrun: it would end after the worker leaves
        (``late``), or the consumer stops. No attempt counts; it goes to the front."""
        if late:
            self.walltime.given_back += 1
            logger.info("consumer %d: lease %d (%d items) would end after the worker leaves; "
                        "giving it back unrun", self.index, batch.lease_id, batch.count)
        else:
            logger.debug("consumer %d: stopping; giving lease %d (%d items) back unrun", self.index,
                         batch.lease_id, batch.count)
        await self._settler.give_back(batch.queue_slot, batch.lease_id)

    async def _thread_unless_stopping(self, threads: asyncio.Semaphore) -> bool:
        """Acquire ``threads`` (True), unless the consumer stops first (False, not acquired).
        A batch that gets its thread as the stop comes runs: its items are halted anyway."""
        if self._stop_requested:
            return False
        if not threads.locked():
            # A free thread (the usual case when not saturated): taken without suspending,
            # so a single task is not held up by two helper tasks and a wait.
            await threads.acquire()
            return True
        acquire = asyncio.ensure_future(threads.acquire())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({acquire, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if acquire.done():
            return True
        acquire.cancel()
        try:
            await acquire
        except asyncio.CancelledError:
            return False
        threads.release()  # acquired while being cancelled: give it back
        return False

    async def _record_abandoned(self, batch: Batch) -> None:
        errors = {p: time_limit_error(batch, p) for p in range(batch.count)}
        try:
            await self._settler.record(batch, Outcome(batch.count, errors, set(), [None] * batch.count))
        except Exception:
            logger.exception("consumer %d: recording the time-limit failures of lease %d failed",
                             self.index, batch.lease_id)

    async def _run(self, batch: Batch, start_by: float | None = None) -> tuple[Outcome, float]:
        """Run ``batch`` on the thread pool, or in the child process when there is one (either
        may hold it until a thread frees, and raise ``NotStarted`` past ``start_by``)."""
        if self.process is None:
            return await self._thread_runner.run(batch, start_by)
        done, errors, fatal, blob, run_s = await self.process.run(batch, batch.funcs or {}, start_by)
        return Outcome(done, errors, fatal, [], blob), run_s

