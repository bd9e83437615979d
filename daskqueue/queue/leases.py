"""``LeaseTable``: a queue core's live leases, their ids and deadlines.

Pure, not thread-safe: a part of one queue core. Deadlines sit in a lazy heap: an entry
whose lease was settled or extended goes stale and is skipped when it comes up.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Iterator

from daskqueue.queue.records import Lease, Span
from daskqueue.queue.selection import RunningTypes

__all__ = ["LeaseTable"]


class LeaseTable:
    """Live leases by id. Ids count up from ``id_base + 1``; typed leases are counted in
    ``running`` (their type's running batches)."""

    def __init__(self, running: RunningTypes, *, id_base: int = 0) -> None:
        self._leases: dict[int, Lease] = {}
        self._deadlines: list[tuple[float, int]] = []  # heap of (deadline, lease_id)
        self._ids = itertools.count(id_base + 1)
        self._running = running
        #: Messages leased.
        self.count = 0

    def __len__(self) -> int:
        return len(self._leases)

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._leases.values()))

    def get(self, lease_id: int) -> Lease | None:
        return self._leases.get(lease_id)

    def __getitem__(self, lease_id: int) -> Lease:
        """The live lease ``lease_id``; ``KeyError`` if unknown."""
        return self._leases[lease_id]

    def new(self, spans: list[Span], *, deadline: float, owner: str | None, started: float,
            t: str | None = None, typed: bool = False) -> Lease:
        """A lease of ``spans`` under the next id."""
        return self.add(Lease(next(self._ids), spans, deadline, sum(s.count for s in spans), owner, started, typed, t))

    def add(self, lease: Lease) -> Lease:
        """Hold ``lease`` under its own id (a new one, or one handed over)."""
        if lease.lease_id in self._leases:
            raise ValueError(f"lease {lease.lease_id} exists already")
        self._leases[lease.lease_id] = lease
        self.count += lease.count
        if lease.typed:
            self._running.started(lease.type)
        heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id))
        return lease

    def pop(self, lease_id: int) -> Lease:
        """End a live lease; raise ``KeyError`` if unknown."""
        lease = self._leases.pop(lease_id)
        if lease.typed:
            self._running.ended(lease.type)
        self.count -= lease.count
        return lease

    def extend(self, lease_id: int, deadline: float) -> bool:
        """Push a live lease's deadline to ``deadline`` (never earlier); False if unknown."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return False
        if deadline > lease.deadline:
            lease.deadline = deadline
            heapq.heappush(self._deadlines, (deadline, lease_id))
        return True

    def pop_expired(self, now: float) -> Iterator[Lease]:
        """End and yield each lease whose deadline is ``<= now``, earliest first."""
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, lease_id = heapq.heappop(self._deadlines)
            lease = self._leases.get(lease_id)
            if lease is not None and lease.deadline == deadline:  # else settled, or extended
                yield self.pop(lease_id)

    def owned_by(self, owners: set[str] | frozenset[str]) -> list[int]:
        """The ids of the leases held by one of ``owners``."""
        return [i for i, lease in self._leases.items() if lease.owner in owners]

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live lease, if any (stale heap entries are dropped)."""
        while self._deadlines:
            deadline, lease_id = self._deadlines[0]
            lease = self._leases.get(lease_id)
            if lease is not None and lease.deadline == deadline:
                return deadline
            heapq.heappop(self._deadlines)
        return None

    def take_next_id(self) -> int:
        """The id the next lease gets (it still gets it)."""
        nxt = next(self._ids)
        self._ids = itertools.count(nxt)
        return nxt

    def continue_from(self, theirs: int) -> None:
        """Ids count up from a random base per actor; should this table's range reach
        ``theirs`` (the next id of an imported state), start past them: a new lease must
        never take a live lease's id."""
        nxt = next(self._ids)
        self._ids = itertools.count(theirs if 0 <= theirs - nxt < 1 << 32 else nxt)

    def validate(self, *, never_expire: str) -> None:
        leased = sum(lease.count for lease in self._leases.values())
        assert leased == self.count, f"leased count {self.count} != {leased} in leases"
        for lease in self._leases.values():
            assert lease.count == sum(s.count for s in lease.spans), "lease count != its spans"
            assert lease.owner == never_expire or (lease.deadline, lease.lease_id) in self._deadlines, \
                "lease missing from heap"
