"""The queue core's views of its state (live spans, delayed spans, counts) and the invariants
it keeps (``validate()``, called after every operation in the state-machine tests).

A part of :class:`daskqueue.queue.core.QueueCore` (a mixin over its state): pure, read only.
"""

from __future__ import annotations

from daskqueue.queue.records import MOVER, CoreStats, Span

__all__ = ["InspectionMixin"]


class InspectionMixin:
    """``live_spans``, ``delayed``, ``stats``, ``validate``."""

    def live_spans(self) -> list[tuple[Span, str]]:
        """Every unsettled span with its state: ``"ready"``, ``"delayed"`` or ``"leased"``."""
        out = [(s, "ready") for s in self._ready.spans()]
        out += [(s, "delayed") for s in self._delayed.spans()]
        out += [(s, "leased") for lease in self._leases for s in lease.spans]
        return out

    def delayed(self) -> list[tuple[float, Span]]:
        """``(not_before, span)`` of every delayed span, earliest first."""
        return self._delayed.entries()

    @property
    def pending(self) -> int:
        """Messages not yet settled (ready, delayed or leased): ``stats().pending`` without
        building the stats (asked on every settle, see the sweeper)."""
        return self._ready.count + self._delayed.count + self._leases.count

    def stats(self) -> CoreStats:
        n = self._n
        return CoreStats(
            ready=self._ready.count,
            delayed=self._delayed.count,
            leased=self._leases.count,
            dead=len(self.dead),
            total_put=n.total_put,
            total_acked=n.total_acked,
            total_retried=n.total_retried,
            total_expired=n.total_expired,
            total_taken_back=n.total_taken_back,
            total_moved=n.total_moved,
            total_purged=n.total_purged,
        )

    def validate(self) -> None:
        """Check every invariant; raise ``AssertionError`` naming the first that fails."""
        n = self._n
        self._ready.validate()
        self._delayed.validate()
        self._leases.validate(never_expire=MOVER)
        assert self.pending == self.stats().pending, "pending differs from the stats' count"
        spans = [s for s, _ in self.live_spans()]
        for s in spans:
            assert 0 <= s.start < s.stop <= s.chunk.count, f"bad span {s.start}..{s.stop}"
            assert 0 <= s.attempts <= self.max_retries, f"span attempts {s.attempts}"
        seqs = [s.chunk.base_seq + i for s in spans for i in range(s.start, s.stop)]
        seqs += [d.seq for d in self.dead]
        assert len(seqs) == len(set(seqs)), "a message is in two places"
        self._dead.validate()
        leased_keys = [s.chunk.key for lease in self._leases if lease.owner != MOVER
                       for s in lease.spans if s.chunk.key]
        assert len(leased_keys) == len(set(leased_keys)), "two messages of one key leased at once"
        for key in leased_keys:
            assert key in self._holders, f"leased key {key!r} not held"
        if self.policy.typed:
            leases: dict[str | None, int] = {}
            for lease in self._leases:
                if lease.typed:
                    assert all(s.chunk.type == lease.type for s in lease.spans), "mixed typed lease"
                    leases[lease.type] = leases.get(lease.type, 0) + 1
            running = self._running.as_dict()
            assert leases == running, f"running {running} != {leases}"
        settled = n.total_acked + len(self.dead) + n.total_moved + n.total_purged
        ready, delayed, leased = self._ready.count, self._delayed.count, self._leases.count
        assert n.total_put == settled + ready + delayed + leased, (
            f"put {n.total_put} != acked+dead+moved {settled} + ready {ready} + delayed "
            f"{delayed} + leased {leased}"
        )
