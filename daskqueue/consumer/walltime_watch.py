"""The clock side of a consumer's walltime: when its worker leaves, and what the pure
:class:`~daskqueue.consumer.walltime.WalltimeGuard` says at the present time.

:class:`WalltimeWatch` is owned by the consumer's run slots (``daskqueue.consumer.running``):
they ask it how much to fetch, whether a fetched batch still ends in time if it starts now,
and the latest start to send with a batch that waits for a run thread in the child process.
Event-loop only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from daskqueue.consumer.batch import Batch
from daskqueue.consumer.leaving import leaving_time, retire_at
from daskqueue.consumer.walltime import DurationEstimates, WalltimeGuard

__all__ = ["WalltimeWatch"]

logger = logging.getLogger("daskqueue")


class WalltimeWatch:
    """One consumer's measured durations and, once its worker's end is known, its guard
    (None until then, and for good on a worker that does not leave on its own)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.durations = DurationEstimates()  # measured always: a guard may come later
        self.guard: WalltimeGuard | None = None
        self.given_back = 0  # batches given back unrun because they would end too late

    async def look_up(self) -> None:
        """Find when this worker leaves (never fails: no guard then); under SLURM, have the
        worker retire before its job is killed."""
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):  # not on a worker (a consumer run in a test, off Dask)
            return
        try:
            leaving = await leaving_time(worker)
        except Exception:
            logger.exception("consumer %d: cannot tell when worker %s leaves", self.index, worker.address)
            return
        if leaving is None:
            return
        self.guard = WalltimeGuard(leaving.at, self.durations)
        if leaving.source == "slurm":
            retire_at(worker, leaving.at)
        logger.info("consumer %d: its worker leaves in %.1f s (%s); it takes only work that ends before",
                    self.index, leaving.at - time.time(), leaving.source)

    def observe(self, done: int, run_s: float, types: Iterable[str | None]) -> None:
        self.durations.observe(done, run_s, types)

    def fetch_limit(self, wanted: int, *, thread_free: bool) -> int | None:
        """How many of ``wanted`` messages the next fetch may take: None (no end known),
        else the guard's say (0: none now)."""
        if self.guard is None:
            return None
        return self.guard.items_to_fetch(time.time(), wanted, thread_free=thread_free)

    def too_late(self, batch: Batch) -> bool:
        """Whether ``batch``, starting now, would end after the worker leaves."""
        return self.guard is not None and not self.guard.fits(time.time(), _type_counts(batch))

    def start_by(self, batch: Batch) -> float | None:
        """The latest start that still ends ``batch`` in time (epoch s), or None (no end known)."""
        return None if self.guard is None else self.guard.latest_start(_type_counts(batch))


def _type_counts(batch: Batch) -> dict[str | None, int]:
    """How many items of each message type ``batch`` holds."""
    counts: dict[str | None, int] = {}
    for seg in batch.segments:
        counts[seg.type] = counts.get(seg.type, 0) + seg.count
    return counts
