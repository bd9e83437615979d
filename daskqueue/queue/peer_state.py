"""What a queue knows of its peers and has told them: a pure class (no Dask, no clock reads).

The queues of one pool tell each other when they have ready messages (*work announcements*: a
consumer's long poll of its home queue hears where work is instead of asking every queue in
turn) and, in a typed pool, their counts per type (*gossip*: what fair shares and caps are taken
of). :class:`PeerBoard` holds both directions of that talk and decides what to say and where a
consumer should go; the actor side (:mod:`daskqueue.queue.peers`) does the calls and passes the
time in. Tested directly in ``tests/queue/test_peer_state.py``.

Announcement numbers are ordered across a queue's incarnations: a queue reopened elsewhere
(its worker died) or handed off is a new actor with the same index, and a peer that heard
the old one must not take the new one's announcements for older ones (issue 21: it dropped
them all, and no consumer went to the reopened queue). So each incarnation numbers its
announcements from its *epoch* (the actor passes the microsecond of its start: it makes at
most ``1 / WORK_ANNOUNCE_S`` announcements a second, far fewer than the microseconds that
pass, so a successor starts above its predecessor's last number while the workers' clocks
agree to within the predecessor's lifetime). Should they not, a peer that heard a higher
number from this index says so with its own announcements (:meth:`PeerBoard.last_heard`),
and this queue jumps above it (:meth:`PeerBoard.heard_of_me`) and announces afresh.
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

    def __init__(self, index: int, *, epoch: int = 0, announce_every_s: float = WORK_ANNOUNCE_S,
                 stale_after_s: float = 3.0) -> None:
        self.index = index
        self.announce_every_s = announce_every_s
        self.stale_after_s = stale_after_s
        #: peer index -> (the number of its announcement, its top ready priority)
        self.work_at: dict[int, tuple[int, int]] = {}
        self._heard: dict[int, int] = {}  # peer index -> the number of its latest announcement
        self.announced: Any = UNTOLD  # the top priority last told the peers (None: no work)
        #: the number of this queue's last announcement (its epoch before the first; each
        #: peer keeps the latest number it heard, and ignores lower ones)
        self.number = epoch
        self._announced_at = -float("inf")
        self._went_empty = False
        self._reports: dict[int, tuple[float, Counts]] = {}  # peer index -> (when, its counts)

    # -- what the peers said -------------------------------------------------------------------

    def keep_only(self, peers: Iterable[int]) -> None:
        """The pool's queues changed: forget other queues' work, and tell the peers the
        current state afresh (a moved peer starts knowing nothing)."""
        keep = set(peers)
        self.work_at = {i: v for i, v in self.work_at.items() if i in keep}
        # What was heard of a peer that moved is kept: its successor numbers above it (see
        # the module's docstring), and an announcement of the successor heard before this
        # call must not be lost.
        self._heard = {i: n for i, n in self._heard.items() if i in keep}
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

    def last_heard(self, index: int) -> int:
        """The number of the latest announcement heard from peer ``index`` (0: none), sent
        along with this queue's own announcements to that peer (see :meth:`heard_of_me`)."""
        return self._heard.get(index, 0)

    def heard_of_me(self, seen: int) -> bool:
        """A peer heard announcement number ``seen`` from this queue's index: if that is above
        this queue's own count, an earlier incarnation made it (a clock behind the
        predecessor's), and the peer ignores this one's announcements until they number
        higher. Returns whether that was so: this queue's numbers then continue above
        ``seen`` and its state is news to every peer again (announce it)."""
        if seen <= self.number:
            return False
        self.number = seen
        self.announced = UNTOLD
        return True

    def forget_work(self, indices: Iterable[int]) -> None:
        """These peers are gone (their workers died): their work is not where a consumer can
        go, and their counts per type are not counted (their running batches died with their
        consumers; a reopened peer reports its ready ones afresh)."""
        for i in indices:
            self.work_at.pop(i, None)
            self._reports.pop(i, None)

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
        self.number += 1
        return self.number

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
