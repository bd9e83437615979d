"""``as_completed``'s outcomes, a poll's worth at a time: a mixin of
:class:`~daskqueue.outcomes.Outcomes`.

``Outcomes.batches`` picks the way: ids that form runs (a list ``batch_submit`` returned, or
any distinct ids in runs) are *claimed* (:mod:`daskqueue.stream_claim`): their outcomes are
routed to the stream as they are filed, and drained from it, with no check per id; any
other ids, or none (every outcome), are *taken* from the filed results as they arrive. Either
way the stream ends once every id has its outcome, or the pool is idle (then ids with none
to come raise :class:`ConfigurationError`), and a reader that stops in the middle of a batch
gets its rest given back to the results. The waits themselves (polls, rests, the idle
check) are :class:`~daskqueue.outcomes.Outcomes`'.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Iterator

from daskqueue import outcome_rest
from daskqueue.errors import ConfigurationError, JoinTimeoutError
from daskqueue.stream_claim import StreamClaim

__all__ = ["Batch", "CompletedBatches"]

#: One poll's outcomes, ``(task_id, outcome)`` pairs made as they are read (``zip``).
Batch = Iterator[tuple[int, Any]]


class CompletedBatches:
    """The two ways of ``Outcomes.batches`` (see the module docstring)."""

    collector: Any
    table: Any

    def _claimed_batches(self, ids: list[int], runs: list[tuple[int, int, int, int]], inflight: Callable[[], int],
                         deadline: float | None, timeout_s: float | None) -> Iterator[Batch]:
        """``batches`` of distinct ids, claimed (see :mod:`daskqueue.stream_claim`) for as
        long as the caller takes them."""
        claim = StreamClaim(ids)
        if not self.collector.claim_stream(claim, runs):
            yield from self._taken_batches(inflight, ids, deadline, timeout_s)
            return
        collector = self.collector
        batch: Batch = iter(())  # the batch being read: its rest is given back on close
        asked: list[float] = []  # when the stats were last asked (see _stats_due)
        try:
            while True:
                got, values = collector.drain_stream(claim)
                if got:
                    yield (batch := zip(got, values))
                if claim.complete:
                    got, values = collector.drain_stream(claim)
                    if got:
                        yield (batch := zip(got, values))
                    return
                if self._poll_until(deadline, timeout_s):
                    if deadline is not None and time.monotonic() > deadline:  # others' outcomes keep coming
                        raise JoinTimeoutError(timeout_s or 0.0, {"pending": claim.n - claim.settled})
                    continue
                if self._stats_due(asked, deadline) and self.settled_all(inflight, deadline, timeout_s):
                    self._poll_until(deadline, timeout_s)
                    got, values = collector.drain_stream(claim)
                    if got:
                        yield (batch := zip(got, values))
                    if not claim.complete:
                        missing = claim.missing()
                        raise ConfigurationError(
                            f"{len(missing):,} of the ids (e.g. {min(missing)}) have no outcome to come: "
                            "taken already (by as_completed or results(clear=True)), or not of this pool")
                    return
                self.table.check_scheduler()
                self._await_outcomes(deadline, timeout_s, first=True)  # yielded as they come
        finally:
            collector.release_stream(claim)
            collector.give_back(batch)  # empty unless the reader stopped in its middle

    def _taken_batches(self, inflight: Callable[[], int], ids: Iterable[int] | None, deadline: float | None,
                       timeout_s: float | None) -> Iterator[Batch]:
        wanted = None if ids is None else set(ids)
        collector = self.collector
        cursor = None
        batch: Batch = iter(())  # the batch being read: its rest is given back on close
        rests = outcome_rest.MapRest()  # a flat poll interval after each empty round stalled it
        try:
            while wanted is None or wanted:
                self._poll_until(deadline, timeout_s)
                got, values, cursor = collector.take_since(wanted, cursor)
                if got:
                    if wanted is not None:
                        wanted.difference_update(got)
                        rests.arrived(time.monotonic(), len(got), len(wanted))
                    yield (batch := zip(got, values))
                    continue
                if self.settled_all(inflight, deadline, timeout_s):
                    self._poll_until(deadline, timeout_s)
                    got, values, cursor = collector.take_since(wanted, cursor)
                    if got:
                        yield (batch := zip(got, values))
                    if wanted is not None:
                        wanted.difference_update(got)
                        if wanted:
                            raise ConfigurationError(
                                f"{len(wanted):,} of the ids (e.g. {min(wanted)}) have no outcome to come: "
                                "taken already (by as_completed or results(clear=True)), or not of this pool")
                    return
                self.table.check_scheduler()
                self._rest(None if wanted is None else len(wanted), deadline, timeout_s, rests.next())
        finally:
            collector.give_back(batch)  # empty unless the reader stopped in its middle
