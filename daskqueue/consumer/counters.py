"""A consumer's counters and task-duration histogram, and the snapshot ``stats()`` returns."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field, fields

from daskqueue import defaults

__all__ = ["ConsumerStats", "Counters", "DURATION_BUCKETS_S"]

#: Upper bounds (seconds) of the task-duration histogram of :class:`ConsumerStats`.
DURATION_BUCKETS_S = defaults.DURATION_BUCKETS_S


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A snapshot of one consumer."""

    index: int
    running: bool
    batches: int
    items_done: int
    items_failed: int
    inflight_items: int
    batch_size: int
    refused_settlements: int
    fetch_calls: int
    busy_slots: int = 0  # batches running now (not counting those fetched ahead)
    #: Task durations: the count of tasks whose run took at most each of
    #: ``DURATION_BUCKETS_S`` (cumulative, as Prometheus histograms are), their total, and
    #: the sum of their durations. A batch's tasks count its mean time per task each.
    duration_buckets: tuple[int, ...] = ()
    duration_count: int = 0
    duration_sum_s: float = 0.0
    #: Queues this consumer holds fetched batches of (running or waiting for a thread): a
    #: queue being removed waits for them, since an early-acked batch's outcomes reach the
    #: queue only after it ran.
    inflight_queues: tuple[int, ...] = ()


@dataclass(slots=True)
class Counters:
    """What one consumer did so far, under the names of :class:`ConsumerStats`. Event-loop
    only: the run threads never touch it."""

    batches: int = 0
    items_done: int = 0
    items_failed: int = 0
    refused_settlements: int = 0  # a queue refused them: the lease had expired
    fetch_calls: int = 0
    #: Batches handed to a runner (a thread pool or the child process), counting one fetched
    #: ahead while it waits for a thread.
    busy_slots: int = 0
    duration_count: int = 0
    duration_sum_s: float = 0.0
    #: Tasks by the first bound of ``DURATION_BUCKETS_S`` at or above their duration (not
    #: cumulative: a batch costs one bisect, not a pass over every bound, on the event loop).
    _by_bucket: list[int] = field(default_factory=lambda: [0] * len(DURATION_BUCKETS_S))

    @property
    def duration_buckets(self) -> list[int]:
        """Per bound of ``DURATION_BUCKETS_S``, the tasks that took at most that long
        (cumulative, as Prometheus histograms are)."""
        out, total = [], 0
        for n in self._by_bucket:
            total += n
            out.append(total)
        return out

    def observe(self, done: int, run_s: float) -> None:
        """Count ``done`` tasks that took ``run_s`` in all in the duration histogram."""
        if done <= 0:
            return
        i = bisect_left(DURATION_BUCKETS_S, run_s / done)
        if i < len(self._by_bucket):  # longer than every bound: only in the count (+Inf)
            self._by_bucket[i] += done
        self.duration_count += done
        self.duration_sum_s += run_s

    def snapshot(self, index: int, *, running: bool, inflight_items: int, batch_size: int,
                 inflight_queues: tuple[int, ...] = ()) -> ConsumerStats:
        """These counters with the consumer's state, as the consumer's ``stats()``."""
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_by_bucket"}
        counts["duration_buckets"] = tuple(self.duration_buckets)
        return ConsumerStats(index=index, running=running, inflight_items=inflight_items,
                             batch_size=batch_size, inflight_queues=inflight_queues, **counts)

    def count(self, done: int, failed: int) -> None:
        """A settled batch: ``done`` messages ran, ``failed`` of them failed."""
        self.batches += 1
        self.items_done += done - failed
        self.items_failed += failed
