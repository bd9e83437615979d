"""What a queue knows of its peers and has told them: a pure class (no Dask, no clock reads).

The queues of one pool tell each other when they have ready messages (*work announcements*: a
consumer's long poll of its home queue hears where work is instead of asking every queue in
turn) and, in a typed pool, their counts per type (*gossip*: what fair shares and caps are taken
of). :class:`PeerBoard` holds both directions of that talk and decides what to say and where a
consumer should go; the actor side (:mod:`daskqueue.queue.peers`) does the calls and passes the
time in. Tested directly in ``tests/queue/test_peer_state.py``.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["PeerBoard", "UNTOLD", "WORK_ANNOUNCE_S"]

#: What a queue has told its peers before it told them anything (equal to no priority).
UNTOLD: Any = object()

#: At most this often a queue tells its peers that it now has ready messages, or has none.
WORK_ANNOUNCE_S = 0.02

Counts = dict[Any, tuple[int, int]]  # type -> (ready messages, running batches)


class PeerBoard:
    """The peers' announcements heard, what this queue announced, and the peers' type counts.

    Not thread-safe: its owner (a queue actor) uses it from the worker's event loop only.
    """

    def __init__(self, index: int, *, announce_every_s: float = WORK_ANNOUNCE_S, stale_after_s: float = 3.0) -> None:
        self.index = index
        self.announce_every_s = announce_every_s
        self.stale_after_s = stale_after_s
        #: peer index -> (the number of its announcement, its top ready priority)
        self.work_at: dict[int, tuple[int, int]] = {}
        self._heard: dict[int, int] = {}  # peer index -> the number of its latest announcement
        self.announced: Any = UNTOLD  # the top priority last told the peers (None: no work)
        self.announcements = 0  # how many this queue made (each peer keeps the latest number)
        self._announced_at = -float("inf")
        self._went_empty = False
        self._reports: dict[int, tuple[float, Counts]] = {}  # peer index -> (when, its counts)

    # -- what the peers said -------------------------------------------------------------------

    def keep_only(self, peers: Iterable[int]) -> None:
        """The pool's queues changed: forget other queues' work, and tell the peers the
        current state afresh (a moved peer starts knowing nothing)."""
        keep = set(peers)
        self.work_at = {i: v for i, v in self.work_at.items() if i in keep}
        self.announced = UNTOLD

    def heard(self, index: int, top_priority: int | None, number: int = 0) -> bool:
        """Peer ``index`` announced ``top_priority`` (None: no work left) in its announcement
        ``number``; returns whether it now counts as having work (a waiting getter may go
        there). An announcement older than one heard already is ignored (0: always taken)."""
        if number and number < self._heard.get(index, 0):
            return False
        self._heard[index] = number
        if top_priority is None:
            self.work_at.pop(index, None)
            return False
        self.work_at[index] = (number, top_priority)
        return True

    def forget_work(self, indices: Iterable[int]) -> None:
        """These peers are gone (their workers died): their work is not where a consumer can go."""
        for i in indices:
            self.work_at.pop(i, None)

    def better_than(self, here: int | None, ignore: Iterable[Any] | None,
                    min_priority: int | None = None) -> list[tuple[int, int]]:
        """``(index, number)`` of the peers whose top ready priority is above ``here`` (this
        queue's; None: it has none, and nothing counts as better), highest first, but the
        pairs in ``ignore``: a consumer takes the most urgent work it can reach."""
        if here is None:
            return []
        stale = set(map(tuple, ignore or ()))
        floor = here if min_priority is None else max(here, min_priority - 1)
        better = [(top, i, n) for i, (n, top) in self.work_at.items() if top > floor and (i, n) not in stale]
        return [(i, n) for _, i, n in sorted(better, reverse=True)]

    def elsewhere(self, ignore: Iterable[Any] | None, min_priority: int | None = None) -> list[tuple[int, int]]:
        """``(index, number)`` of every peer with work of priority ``>= min_priority``,
        highest first, but the pairs in ``ignore`` (a consumer found those empty after all)."""
        stale = set(map(tuple, ignore or ()))
        return [(i, n) for i, (n, top) in sorted(self.work_at.items(), key=lambda w: -w[1][1])
                if (i, n) not in stale and (min_priority is None or top >= min_priority)]

    # -- what this queue tells them ------------------------------------------------------------

    def changed(self, top: int | None) -> bool:
        """This queue's top priority for others is now ``top``: returns whether the peers
        should hear of it (an announcement is due)."""
        if top is None and self.announced not in (None, UNTOLD):
            self._went_empty = True  # work told of is gone: new work needs a new announcement
        return self.news(top)

    def news(self, top: int | None) -> bool:
        """Whether ``top`` is not what the peers were told, or is new work since then."""
        return top != self.announced or (top is not None and self._went_empty)

    def wait_before_announcing(self, now: float) -> float:
        """Seconds to wait before the next announcement (announcements are spaced)."""
        return max(0.0, self._announced_at + self.announce_every_s - now)

    def announce(self, top: int | None, now: float) -> int:
        """Record that the peers are told ``top`` now; returns the announcement's number."""
        self.announced, self._announced_at, self._went_empty = top, now, False
        self.announcements += 1
        return self.announcements

    # -- typed pools: the peers' counts per type -----------------------------------------------

    def report(self, index: int, counts: Counts, now: float) -> None:
        """Peer ``index`` has these ready messages and running batches per type."""
        self._reports[index] = (now, counts)

    def totals(self, now: float) -> tuple[dict[Any, int], dict[Any, int]]:
        """The fresh reports summed per type, ``(ready, running)``; stale ones are dropped."""
        fresh_after = now - self.stale_after_s
        ready: dict[Any, int] = {}
        running: dict[Any, int] = {}
        for index, (at, counts) in list(self._reports.items()):
            if at < fresh_after or index == self.index:
                del self._reports[index]
                continue
            for t, (r, n) in counts.items():
                ready[t] = ready.get(t, 0) + r
                running[t] = running.get(t, 0) + n
        return ready, running
