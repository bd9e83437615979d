"""The queue actor's sweeper: one asyncio task that expires leases, promotes delayed messages,
runs the storage's housekeeping, reports the load to the scheduler and checks that the worker
still holds the actor (it closes an orphan).

A mixin of :class:`~daskqueue.queue.base.QueueActorBase` (see there why mixins). The task is
started by ``_start`` and stopped by ``_stop_sweeper`` (``close`` and ``hand_off``): whoever
starts it stops and awaits it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from daskqueue import defaults
from daskqueue.membership import LOAD_TOPIC
from daskqueue.queue.core import CoreStats, Lease
from daskqueue.queue.handles import ORPHAN_CHECK_S, released_actor

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore

__all__ = ["SweeperMixin", "LOAD_REPORT_S", "LOAD_CONFIRM_S"]

logger = logging.getLogger("daskqueue")

#: How often a queue with work reports its load to the scheduler (for ``adapt()``).
LOAD_REPORT_S = 1.0

#: How soon after its first report of new work a queue reports again, at the latest (a
#: settle that leaves work sends it sooner). The scheduler counts a backlog only once two
#: reports in a row had work (a burst over by then starts no worker: its queue said at once
#: that it emptied), so this, not ``LOAD_REPORT_S``, is the longest ``adapt`` waits to see a
#: backlog (it waited a whole ``LOAD_REPORT_S``: issue 24, churn).
LOAD_CONFIRM_S = 0.2


class SweeperMixin:
    """The sweeper task, its wakeups, the load reports and the orphan check."""

    # Owned by QueueActorBase.
    index: int
    pool: str | None
    _core: QueueCore
    _closed: bool

    def _init_sweeper(self) -> None:
        self._sweeper: asyncio.Task[None] | None = None
        self._timer_changed: asyncio.Event | None = None
        self._sweep_at: float | None = None  # when the sweeper plans to wake next
        self._task_s: float | None = None  # measured seconds per message, lease to settle
        self._reported_at = 0.0  # when the load was last reported to the scheduler
        self._reported_work = False  # whether that report had work in it
        self._work_reports = 0  # how many reports in a row had work (the second confirms it)
        self._checked_at = 0.0  # when the sweeper last checked that its worker holds it
        self._orphan_close: asyncio.Task[None] | None = None

    def _start_sweeper(self) -> None:
        self._timer_changed = asyncio.Event()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _stop_sweeper(self) -> None:
        """Wake the sweeper (``_closed`` is set) and wait for it: it finishes a compaction it
        runs before it returns."""
        if self._sweeper is not None:
            assert self._timer_changed is not None
            self._timer_changed.set()
            await self._sweeper
            self._sweeper = None

    async def _sweep_forever(self) -> None:
        """Expire leases and promote delayed messages when they fall due; sleep otherwise.

        Passes the gate after each ``await``: a compaction may have begun meanwhile.
        """
        while True:
            await self._unpaused()
            if self._closed:
                return
            await self._sleep_until_due()
            await self._unpaused()
            if self._closed:
                return
            if self._orphaned():
                return
            await self._sweep_once(self._now())

    def _orphaned(self) -> bool:
        """Every ``ORPHAN_CHECK_S``: if the worker released this actor (its pool's client is
        gone), close it (on a task of its own: ``close`` awaits this sweeper), so that its
        directory's lock is free for the next pool. Returns whether it did."""
        now = time.monotonic()
        if now - self._checked_at < ORPHAN_CHECK_S:
            return False
        self._checked_at = now
        if not released_actor(self):
            return False
        logger.warning("queue %d: its pool's client is gone (the worker released the actor); "
                       "closing it", self.index)
        # Held here, not awaited: nobody is left to await it; it ends when close() does.
        self._orphan_close = asyncio.get_running_loop().create_task(self.close())
        return True

    async def _sleep_until_due(self) -> None:
        """Until the next lease deadline, delayed message or housekeeping, or a wakeup."""
        assert self._timer_changed is not None
        wakeup = self._core.next_wakeup()
        now = self._now()
        timeout = None if wakeup is None else max(0.0, wakeup - now) + defaults.DUE_WAKEUP_MARGIN_S
        orphan_check = max(0.0, self._checked_at + ORPHAN_CHECK_S - time.monotonic())
        for chore in (self._housekeeping_due_in(), self._report_due_in(), orphan_check):
            if chore is not None:
                timeout = chore if timeout is None else min(timeout, chore)
        # When it wakes anyway (its chores included): a new lease, whose deadline is far
        # past that, then wakes nobody (see _reschedule; on one task's path, issue 24).
        self._sweep_at = None if timeout is None else now + timeout
        self._timer_changed.clear()
        # asyncio.wait, not wait_for: on Python 3.11 a wait_for cancelled just as its inner
        # wait finishes returns instead of raising, and a cancelled sweeper would run on.
        waiter = asyncio.ensure_future(self._timer_changed.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()

    async def _sweep_once(self, now: float) -> None:
        """One wakeup's work: expire, persist, wake getters, then housekeeping, last because
        it may pause the queue."""
        expired = self._core.expire(now=now)
        if expired:
            logger.info("queue %d: %d leased messages expired; redelivering", self.index, expired)
            self._notify_outcomes()  # some may have been dead-lettered
        try:
            self._after_change(now)
        except Exception:
            logger.exception("queue %d: storage housekeeping failed", self.index)
        if self._core.has_ready(now):
            self._notify_ready()
        self._work_changed()
        due = self._report_due_in()
        if due is not None and due <= 0:
            self._report_load()
        try:
            await self._housekeeping()
        except Exception:
            logger.exception("queue %d: storage housekeeping failed", self.index)

    def _reschedule(self) -> None:
        """Wake the sweeper if something now falls due before its planned wakeup: a lease
        deadline, a delayed message, or a load report (work came to a queue that had said it
        had none: ``adapt`` must hear of it within ``LOAD_REPORT_S``, not at the sweeper's
        next chore)."""
        wakeup = self._core.next_wakeup()
        report = self._report_due_in()
        if report is not None:
            at = self._now() + report
            wakeup = at if wakeup is None else min(wakeup, at)
        if wakeup is not None and (self._sweep_at is None or wakeup < self._sweep_at):
            self._sweep_at = wakeup
            assert self._timer_changed is not None
            self._timer_changed.set()

    def _wake_sweeper(self) -> None:
        """Make the sweeper recompute its wakeup (new housekeeping may be due sooner)."""
        if self._timer_changed is not None:
            self._timer_changed.set()

    # -- load reports (what makes ``adapt()`` see the backlog) --------------------------------

    def _report_due_in(self) -> float | None:
        """Seconds until the next load report: ``LOAD_CONFIRM_S`` after the first report of
        new work, then every ``LOAD_REPORT_S`` while the queue has work, and once more when
        it has none left; None when idle and reported so."""
        if self.pool is None:
            return None
        if not (self._core.pending or self._reported_work):
            return None
        interval = LOAD_CONFIRM_S if self._work_reports == 1 else LOAD_REPORT_S
        return max(0.0, self._reported_at + interval - time.monotonic())

    def _report_if_emptied(self) -> None:
        """After a settle. The queue settled its last message: say so to the scheduler now,
        not at the next report (a report of work that outlives it made ``adapt`` start a
        worker for nothing). Or work is left after the first settle of a run of work that
        one report told of: send the second report now, not at ``LOAD_CONFIRM_S``; it makes
        the scheduler count the backlog, sized by a measured time per message."""
        if self._reported_work and not self._core.pending:
            self._report_load()
        elif self._work_reports == 1 and self._task_s is not None:
            self._report_load()

    def _report_load(self, *, closing: bool = False) -> None:
        """Tell the scheduler this queue's backlog (``daskqueue.membership`` adds it to the
        scheduler's adaptive target): messages waiting or running and seconds per message.
        A closing queue reports none."""
        s = self._core.stats() if not closing else CoreStats(0, 0, 0, 0, 0, 0, 0, 0, 0)
        self._reported_at = time.monotonic()
        self._reported_work = bool(s.pending)
        self._work_reports = self._work_reports + 1 if s.pending else 0
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):  # not on a worker (a queue driven by hand in tests)
            return
        worker.log_event(LOAD_TOPIC, {"pool": self.pool, "queue": self.index, "ready": s.ready,
                                      "delayed": s.delayed, "leased": s.leased, "task_s": self._task_s})

    def _measure(self, lease: Lease, done: int, now: float) -> None:
        """Seconds per message from a settled lease (lease to settle: running and the wait
        in the consumer's prefetch, an overestimate by at most one batch)."""
        if done > 0:
            per = max(0.0, now - lease.started) / done
            self._task_s = per if self._task_s is None else 0.8 * self._task_s + 0.2 * per
