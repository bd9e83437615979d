"""Walltime-aware consumers: take no work that cannot end before the worker leaves.

Pure: no Dask, no clock reads, no I/O; the caller passes ``now`` (seconds since the epoch) and
the measured durations. A worker that will leave at a known time (its ``--lifetime``, its
SLURM job's end: :mod:`daskqueue.consumer.leaving` finds it) gets a :class:`WalltimeGuard`;
its consumer asks it how many messages to fetch (:meth:`WalltimeGuard.items_to_fetch`) and,
when a fetched batch is about to start, whether it still ends in time
(:meth:`WalltimeGuard.fits`); a batch that does not is given back unrun (no attempt counts)
for another consumer. So nothing is cut off when the worker leaves, and nothing runs twice.

How long an item takes is judged per message type from this consumer's own measurements
(:class:`DurationEstimates`): a high quantile of the recent per-item times, times a safety
factor. A type never seen counts as the slowest one seen; before anything was measured,
one message at a time is fetched (to learn from), as the batch sizer does anyway.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Mapping

from daskqueue import defaults

__all__ = ["DurationEstimates", "WalltimeGuard", "parse_slurm_time_left"]


class DurationEstimates:
    """Per message type, the recent per-item run times of one consumer (``window`` of
    them) and a high estimate of the next: their ``quantile`` (nearest rank; with few
    samples, the largest) times ``safety``. Not thread-safe: the event loop's only."""

    def __init__(self, *, window: int = defaults.WALLTIME_DURATION_WINDOW,
                 quantile: float = defaults.WALLTIME_QUANTILE, safety: float = defaults.WALLTIME_SAFETY) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        if safety < 1.0:
            raise ValueError(f"safety must be >= 1, got {safety}")
        self._window = window
        self._quantile = quantile
        self._safety = safety
        self._samples: dict[str | None, deque[float]] = {}

    def observe(self, done: int, run_s: float, types: Iterable[str | None]) -> None:
        """A batch ran ``done`` items of ``types`` in ``run_s``: each type gets the mean
        per-item time as a sample (a batch is timed as a whole; batches near a worker's end
        are small, so their means are close to single items)."""
        if done <= 0:
            return
        per_item = max(0.0, run_s) / done
        for t in set(types):
            self._samples.setdefault(t, deque(maxlen=self._window)).append(per_item)

    def estimate(self, type: str | None) -> float | None:
        """How long one item of ``type`` may take, or None if nothing was measured at all
        (a type never seen counts as the slowest seen)."""
        samples = self._samples.get(type)
        if samples is None:
            return self.worst()
        ordered = sorted(samples)
        rank = max(0, math.ceil(self._quantile * len(ordered)) - 1)
        return ordered[rank] * self._safety

    def worst(self) -> float | None:
        """The highest estimate over every type seen, or None."""
        if not self._samples:
            return None
        return max(self.estimate(t) or 0.0 for t in self._samples)

    @property
    def types(self) -> list[str | None]:
        return list(self._samples)


class WalltimeGuard:
    """What a consumer on a worker leaving at ``leaves_at`` (epoch seconds) may take on:
    work that ends ``margin_s`` before then (settling its results takes that long)."""

    def __init__(self, leaves_at: float, estimates: DurationEstimates, *,
                 margin_s: float = defaults.WALLTIME_MARGIN_S) -> None:
        self.leaves_at = leaves_at
        self.estimates = estimates
        self.margin_s = margin_s

    def time_left(self, now: float) -> float:
        """Seconds of work that still end in time."""
        return self.leaves_at - self.margin_s - now

    def items_to_fetch(self, now: float, wanted: int, *, thread_free: bool) -> int:
        """How many of the ``wanted`` messages to fetch now (0: none).

        Items of the slowest type seen must end in time (the queue decides which type a
        batch holds). Close to the end, when the batch sizer's size no longer fits, nothing
        is fetched ahead while every run thread is busy: a batch that waits for a thread
        starts later than now and would be given back at its start.
        """
        left = self.time_left(now)
        if left <= 0:
            return 0
        per_item = self.estimates.worst()
        if per_item is None:
            return min(wanted, 1)
        fit = int(left // per_item) if per_item > 0 else wanted
        if fit >= wanted:
            return wanted
        return fit if thread_free else 0

    def fits(self, now: float, counts: Mapping[str | None, int]) -> bool:
        """Whether a batch of ``counts`` items per type, starting now, ends in time. A batch
        of work never measured runs if there is time left at all (it is how it gets measured)."""
        return self.time_left(now) > 0 and now <= self.latest_start(counts)

    def latest_start(self, counts: Mapping[str | None, int]) -> float:
        """The latest time (epoch s) a batch of ``counts`` items per type may start and still
        end in time, by the estimates as they are now: a batch sent ahead to where it runs
        carries it (``daskqueue.consumer.start_gate``). Work never measured may start until
        no time is left."""
        need = 0.0
        for t, n in counts.items():
            per_item = self.estimates.estimate(t)
            if per_item is None:
                need = 0.0
                break
            need += n * per_item
        return self.leaves_at - self.margin_s - need

    def done(self, now: float) -> bool:
        """Whether no work may start any more: the guard refuses everything from now on."""
        return self.time_left(now) <= 0


_TIME_LEFT = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def parse_slurm_time_left(text: str) -> float | None:
    """Seconds of ``squeue -o %L`` (``[days-][hours:]minutes:seconds``); None for a job
    without a limit (``UNLIMITED``, ``NOT_SET``, ``INVALID``) or text it does not know."""
    m = _TIME_LEFT.match(text.strip())
    if m is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
