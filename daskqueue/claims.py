"""Claims: ranges of a queue's messages whose outcomes go to one caller's object instead of
the collector's ``{id: value}`` dicts (a ``map``'s :class:`~daskqueue.results.MapClaim`, by
input position; an ``as_completed``'s :class:`~daskqueue.stream_claim.StreamClaim`). A mixin
of :class:`~daskqueue.results.ResultCollector`: its state (``_claim_starts``, ``_claims``,
``_closing``, the parked results) and its lock are the collector's.
"""

from __future__ import annotations

import bisect
import logging
from typing import Any

from daskqueue.errors import RemoteTaskError
from daskqueue.messages import id_range, make_id
from daskqueue.stream_claim import StreamClaim, hand_over_parked

#: A ``MapClaim`` of :mod:`daskqueue.results` (not imported: that module imports this one).
MapClaimLike = Any

__all__ = ["ClaimsMixin"]

logger = logging.getLogger("daskqueue")

_MISS = object()  # not found (a value may be None)


class ClaimsMixin:
    """Registering and releasing claims, and finding a message's claim."""

    _lock: Any
    _n: int
    _claim_starts: list[list[int]]
    _claims: list[list[tuple[int, Any, int]]]
    _closing: list[Any]
    _results: dict[int, Any]
    failures: dict[int, Any]
    _arrivals: Any
    _moved_filed: bool
    _parked: list[Any]

    def claim(self, queue_index: int, first_seq: int, count: int, claim: MapClaimLike, pos0: int) -> None:
        """Route the results of messages ``first_seq ..`` of a queue to ``claim``; those filed
        already go to it too when messages moved (see below)."""
        with self._lock:
            starts = self._claim_starts[queue_index]
            i = bisect.bisect(starts, first_seq)
            if i and starts[i - 1] == first_seq and self._claims[queue_index][i - 1][1] is claim:
                return  # registered already (a send interrupted part-way reads its put again)
            starts.insert(i, first_seq)
            self._claims[queue_index].insert(i, (count, claim, pos0))
            if self._moved_filed and (self._parked or self._results or self.failures):
                # A send holds the queues it put to until its claims are registered, not the
                # queues its messages were moved to meanwhile (remove_queue, add_queues): a
                # moved message's outcome, polled from its new queue, may be filed before its
                # claim (seen: a typed map waiting for good for one put's outcomes). Nobody
                # else knows these ids yet: they are the claim's.
                self._unpark()  # type: ignore[attr-defined]
                got = self._hand_over(queue_index, first_seq, count, claim, pos0)
                if got:
                    logger.debug("queue %d: %d outcomes of moved messages filed before their claim "
                                 "(seqs %d..) handed to it", queue_index, got, first_seq)

    def claim_stream(self, claim: StreamClaim, runs: list[tuple[int, int, int, int]]) -> bool:
        """Route the outcomes of ``claim``'s id runs (see :func:`~daskqueue.stream_claim.id_runs`)
        to it, moving those filed already; False (nothing done) if a run is of no queue of
        the pool or overlaps another claim (the caller takes from the dicts instead)."""
        with self._lock:
            for q, first, count, _ in runs:
                if not 0 <= q < self._n or self._claim_overlaps(q, first, count):
                    return False
            for q, first, count, pos0 in runs:
                self.claim(q, first, count, claim, pos0)  # type: ignore[arg-type]
            if self._parked:
                self._parked = hand_over_parked(self._parked, claim, runs)
            if self._results or self.failures:
                for q, first, count, pos0 in runs:
                    self._hand_over(q, first, count, claim, pos0)
            return True

    def _claim_overlaps(self, q: int, first: int, count: int) -> bool:
        starts = self._claim_starts[q]
        i = bisect.bisect(starts, first + count - 1) - 1
        return i >= 0 and starts[i] + self._claims[q][i][0] > first

    def _hand_over(self, q: int, first: int, count: int, claim: StreamClaim, pos0: int) -> int:
        """Outcomes of messages ``first ..`` of queue ``q`` filed before ``claim`` go to it;
        how many."""
        got = 0
        ids = id_range(q, first, count)
        results, failures, miss = self._results, self.failures, _MISS  # type: ignore[attr-defined]
        if results:
            found = [(k, v) for k, i in enumerate(ids) if (v := results.pop(i, miss)) is not miss]
            if len(found) == count:
                claim.succeed(pos0, [v for _, v in found])
            else:
                for k, v in found:
                    claim.succeed(pos0 + k, [v])
            got += len(found)
        if failures:
            for k, i in enumerate(ids):
                if i in failures:
                    claim.fail(pos0 + k, failures.pop(i))
                    got += 1
        return got

    def drain_stream(self, claim: StreamClaim) -> tuple[list[int], list[Any]]:
        """:meth:`StreamClaim.drain` under the lock."""
        with self._lock:
            return claim.drain()

    def release_stream(self, claim: StreamClaim) -> None:
        """Forget ``claim``'s runs; outcomes it got but nobody drained go back to the dicts
        (an ``as_completed`` closed early: they are ``results()``' again)."""
        with self._lock:
            self.release(claim)  # type: ignore[arg-type]
            self.give_back(zip(*claim.drain()))

    def give_back(self, outcomes: Any) -> None:
        """Outcomes ``(task_id, outcome)`` taken but never handed to the caller (an
        ``as_completed`` closed in the middle of a poll's batch) are ``results()`` /
        ``failures()``' again."""
        with self._lock:
            got = []
            for i, v in outcomes:
                (self.failures if isinstance(v, RemoteTaskError) and v.task_id == i else self.results)[i] = v
                got.append(i)
            self._arrivals.add(got)

    def release(self, claim: MapClaimLike) -> None:
        """Forget the ranges of a finished ``map``."""
        with self._lock:
            for q in range(self._n):
                keep = [k for k, c in enumerate(self._claims[q]) if c[1] is not claim]
                self._claim_starts[q] = [self._claim_starts[q][k] for k in keep]
                self._claims[q] = [self._claims[q][k] for k in keep]

    def release_when_complete(self, claims: list[MapClaimLike]) -> None:
        """Release these claims (nobody reads them any more) once each is complete: now, or
        at the poll that completes it (a stream closed early: see queue/streaming.py)."""
        with self._lock:
            self._closing.extend(claims)
            self._release_completed()

    def _release_completed(self) -> None:
        done = [c for c in self._closing if c.complete]
        if done:
            self._closing = [c for c in self._closing if not c.complete]
            for claim in done:
                self.release(claim)

    def _owner(self, q: int, seq: int) -> tuple[MapClaimLike, int] | None:
        starts = self._claim_starts[q]
        i = bisect.bisect(starts, seq) - 1
        if i >= 0:
            count, claim, pos0 = self._claims[q][i]
            if seq < starts[i] + count:
                return claim, pos0 + (seq - starts[i])
        return None
