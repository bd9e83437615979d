"""Which ids moved messages were given: the client's map of moves, bounded.

Pure: no Dask, no clock, no I/O. A message moved to another queue (``add_queues``,
``remove_queue``) or put back by ``replay_dead`` gets a new seq where it lands, but keeps the
id the user was given: its outcome is reported under that. A :class:`MovedIds` keeps, per
queue, the sorted runs ``new first seq -> (count, old queue, old first seq)``, and forgets a
run once every message of it has had its outcome (so the map does not grow for good; an
outcome delivered again after that is reported under its new id). It counts messages, not
deliveries: under at-least-once delivery a message's outcome may arrive twice before another
message of its run has had its own, and that one must still be reported under its old id.
"""

from __future__ import annotations

import bisect
from typing import Any

__all__ = ["MovedIds"]


class MovedIds:
    """The moves of a pool's messages (see the module docstring)."""

    def __init__(self) -> None:
        self._starts: dict[int, list[int]] = {}
        # Per queue, parallel to _starts: [count, old queue, old first seq, outcomes to come,
        # which messages had theirs (a bytearray of count, 1: arrived)].
        self._runs: dict[int, list[list[Any]]] = {}

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __len__(self) -> int:
        """How many runs are kept."""
        return sum(len(s) for s in self._starts.values())

    def has(self, q: int) -> bool:
        """Whether messages moved to queue ``q`` are still followed."""
        return q in self._starts

    def add(self, runs: list[tuple[int, int, int, int]], old_queue: int) -> None:
        """Messages ``(old first seq, count, new queue, new first seq)`` of ``old_queue``
        moved. A run known already (a moved record read twice: at-least-once) is kept once."""
        for old_first, count, q, new_first in runs:
            starts = self._starts.setdefault(q, [])
            i = bisect.bisect(starts, new_first)
            if i and starts[i - 1] == new_first:
                continue
            starts.insert(i, new_first)
            self._runs.setdefault(q, []).insert(i, [count, old_queue, old_first, count, bytearray(count)])

    def pieces(self, q: int, first: int, count: int, *, settle: bool = False) -> list[tuple[int, int, int, int]]:
        """``(queue, seq, count, offset)`` of messages ``first .. first + count`` of queue
        ``q`` under the ids they were given (following moves), in consecutive pieces. With
        ``settle``, their outcomes arrived: runs all of whose outcomes arrived are dropped."""
        starts = self._starts.get(q)
        if not starts:
            return [(q, first, count, 0)]
        out = []
        seq, end = first, first + count
        while seq < end:
            i = bisect.bisect(starts, seq) - 1
            run = self._runs[q][i] if i >= 0 else None
            if run is not None and seq < starts[i] + run[0]:
                take = min(end, starts[i] + run[0]) - seq
                for piece in self.pieces(run[1], run[2] + seq - starts[i], take, settle=settle):
                    out.append(piece[:3] + (piece[3] + seq - first,))
                if settle:
                    at, arrived = seq - starts[i], run[4]
                    run[3] -= take - arrived.count(1, at, at + take)  # an outcome delivered again counts once
                    arrived[at:at + take] = b"\x01" * take
            else:
                nxt = starts[i + 1] if i + 1 < len(starts) else end
                take = min(end, nxt) - seq
                out.append((q, seq, take, seq - first))
            seq += take
        if settle:
            self._drop_settled(q)
        return out

    def _drop_settled(self, q: int) -> None:
        runs = self._runs[q]
        if any(run[3] <= 0 for run in runs):
            keep = [k for k, run in enumerate(runs) if run[3] > 0]
            if keep:
                self._starts[q] = [self._starts[q][k] for k in keep]
                self._runs[q] = [runs[k] for k in keep]
            else:
                del self._starts[q], self._runs[q]

    def given_id(self, q: int, seq: int) -> tuple[int, int]:
        """``(queue, seq)`` of the id message ``seq`` of queue ``q`` was given."""
        return self.pieces(q, seq, 1)[0][:2]

    def where(self, q: int, seq: int) -> tuple[int, int]:
        """``(queue, seq)`` where the message given id ``(q, seq)`` is now (following moves
        forward; itself if it did not move, or its move is forgotten)."""
        for _ in range(len(self) + 1):  # each hop follows a later move: bounded
            hop = self._forward(q, seq)
            if hop is None:
                return q, seq
            q, seq = hop
        return q, seq

    def _forward(self, q: int, seq: int) -> tuple[int, int] | None:
        for nq, runs in self._runs.items():
            for start, (count, oq, ofirst, *_) in zip(self._starts[nq], runs):
                if oq == q and ofirst <= seq < ofirst + count and (nq, start) != (q, seq):
                    return nq, start + seq - ofirst
        return None
