"""The ids ``batch_submit`` returned lately, so that ``as_completed(ids)`` can take them as they are.

``as_completed(ids)`` claims the ids' runs of consecutive seqs per queue. Finding and
checking those runs in a list that came from anywhere costs a copy of the list and a
comparison of every id with a newly made int (:func:`~daskqueue.stream_claim.id_runs`): a
tenth of the client's time in a stream of ``batch_submit`` chunks. A list that
``batch_submit`` has just returned is known already: the queues allocated its runs.

:class:`SentIds` keeps, for the latest sends, a private copy of the list handed out (the
same int objects) and its runs. ``as_completed`` compares the list it is given with that
copy: two lists holding the same objects compare by pointer, in C, a few nanoseconds an id.
Only an equal list is trusted, so a list the caller changed since is never misread (it takes
the general path). A recalled entry is forgotten (its outcomes are taken once).

Only while a stream is on: a pool whose caller never hands a list back to ``as_completed``
keeps nothing (the copy, the runs' merge and up to ``MAX_IDS`` ids held alive were paid on
every ``batch_submit`` of ``MIN_IDS`` or more, stream or not). Keeping starts when
``as_completed`` is given a list (:meth:`SentIds.recall`: that list itself, handed out
before, goes the general way) and stops when a kept list is dropped by the bound without
having been recalled (the caller stopped streaming, or streams with more in flight than
the bound holds: the general way then); the lists kept then stay recallable.

Bounded: lists of fewer than ``MIN_IDS`` ids are not kept (finding their runs costs
little), and at most ``MAX_IDS`` ids are kept in all, the oldest dropped first; a kept copy
holds its ids alive (about 40 bytes an id once the caller dropped its own list). Thread-safe.
Pure: no Dask, no clock, no I/O.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

__all__ = ["SentIds", "Run", "merge_runs", "MIN_IDS", "MAX_IDS"]

#: ``(queue, first seq, count, first position)``: a run of consecutive seqs of one queue at
#: consecutive positions (as :func:`~daskqueue.stream_claim.id_runs` gives them).
Run = tuple[int, int, int, int]

#: Sends of fewer ids are not kept.
MIN_IDS = 4096

#: The most ids kept in all (a stream of chunks needs two: the one read and the next;
#: bounded so that a pool that never streams holds at most ~16 MB of them).
MAX_IDS = 400_000


def merge_runs(runs: list[Run]) -> list[Run]:
    """``runs`` in position order, each merged with the one before when it goes on from it
    (same queue, next seq, next position): a put's packed groups are one run, not hundreds
    (each run is a claim, and an arriving batch of outcomes is split at claim bounds)."""
    out: list[Run] = []
    for q, first, count, pos in sorted(runs, key=lambda r: r[3]):
        if out:
            pq, pfirst, pcount, ppos = out[-1]
            if pq == q and pfirst + pcount == first and ppos + pcount == pos:
                out[-1] = (q, pfirst, pcount + count, ppos)
                continue
        out.append((q, first, count, pos))
    return out


class SentIds:
    """The latest ``batch_submit`` id lists and their runs (see the module docstring)."""

    def __init__(self, *, min_ids: int = MIN_IDS, max_ids: int = MAX_IDS, streaming: bool = False) -> None:
        self._min_ids = min_ids
        self.max_ids = max_ids
        #: Whether lists handed out are kept (see the module docstring).
        self.streaming = streaming
        self._entries: OrderedDict[tuple[int, int, int], tuple[list[int], list[Run]]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    @property
    def min_ids(self) -> int:
        """The fewest ids of a list that is kept; no list is while no stream is on (a
        sender that checks this first skips finding the runs it would offer)."""
        return self._min_ids if self.streaming else sys.maxsize

    def remember(self, ids: list[int], runs: list[Run]) -> None:
        """``ids`` (about to be handed out, their runs ``runs``) may come back: keep a copy
        (while a stream is on). Dropping the oldest, never recalled, past the bound ends it."""
        n = len(ids)
        if n < self.min_ids or n > self.max_ids:
            return
        entry = (ids.copy(), runs)
        with self._lock:
            key = (n, ids[0], ids[-1])
            old = self._entries.pop(key, None)
            if old is not None:
                self._held -= len(old[0])
            self._entries[key] = entry
            self._held += n
            while self._held > self.max_ids:
                _, (dropped, _) = self._entries.popitem(last=False)
                self._held -= len(dropped)
                # Never recalled: nobody streams these lists (any more), keep no new ones.
                self.streaming = False

    def recall(self, ids: list[int]) -> tuple[list[int], list[Run]] | None:
        """The kept copy of ``ids`` and its runs, forgotten now, if ``ids`` equals a list
        handed out lately; else None. A stream is on from now (the next lists are kept)."""
        n = len(ids)
        self.streaming = True
        if n < self._min_ids or not self._entries:
            return None
        try:
            entry = self._entries.get((n, ids[0], ids[-1]))
        except TypeError:  # an unhashable "id": not a list handed out
            return None
        if entry is None or entry[0] != ids:  # compared outside the lock: it may take a while
            return None
        key = (n, ids[0], ids[-1])
        with self._lock:
            if self._entries.get(key) is not entry:  # recalled meanwhile by another thread
                return None
            del self._entries[key]
            self._held -= n
        return entry

    def __len__(self) -> int:
        return len(self._entries)
