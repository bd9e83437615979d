"""An attached handle follows its pool's queues: those the owner adds, and those it removes.

The owner registers its pool again whenever its queues change (:mod:`daskqueue.registry`:
``queues``, the serving ones; ``removed``, those taken out for good; ``resting``, those with
no actor now). An attached handle
(:mod:`daskqueue.queue.attached`) reads that entry at most once per ``FOLLOW_S``, before a put
and before a poll, and

* routes its puts to the queues added since (and polls them: messages of its own may have been
  moved there, with a moved record ahead of their outcomes);
* stops routing to a queue the owner is removing (listed as ``draining``; the owner gives
  handles ``FOLLOW_S`` to see that before it closes the queue), and stops polling it once it
  is removed (it handed the records this handle had not read to another queue first, see
  ``resize.forward_records``);
* polls every queue once per ``FOLLOW_S`` even while it waits on one (``result(id)`` long-polls
  the queue the id names: the moved record of that message may be in another);
* follows a queue that moved (the registry names another actor for it);
* waits for a queue listed as ``resting`` (no worker can take it now: its state waits in the
  owner's client), asking the scheduler for a worker under a demand of its own, as the owner
  does (see :mod:`daskqueue.queue.attached_table`).

A queue that is neither serving nor removed (being reopened elsewhere) is waited for, as before.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable

from daskqueue.errors import PoolClosedError, QueueClosedError
from daskqueue.queue.demand import Demand
from daskqueue.results import ResultCollector

__all__ = ["FOLLOW_S", "HandleCollector", "NoQueue", "apply_entry", "follower_of"]

logger = logging.getLogger("daskqueue")

#: How often an attached handle reads its pool's registry entry (seconds, at most).
FOLLOW_S = 1.0


class NoQueue:
    """The place of a queue that does not serve for a handle (removed, moving, not started)."""

    _future = None
    _address = ""

    def __init__(self, q: int) -> None:
        self.key = f"no-queue-{q}"


class HandleCollector(ResultCollector):
    """The collector of an attached handle: before a poll it calls ``follow()`` (True when it
    read the registry: then a poll of one queue also polls every queue once, without waiting),
    and a queue found removed during a poll is dropped from the poll, which goes on."""

    follow: Callable[[], bool] | None = None

    def poll(self, *, wait_s: float = 0.0, queue_index: int | None = None, deadline: float | None = None,
             first: bool = False) -> int:
        n = 0
        if self.follow is not None and self.follow() and queue_index is not None:
            n += self._poll_open(wait_s=0.0, queue_index=None, deadline=deadline)
        return n + self._poll_open(wait_s=wait_s, queue_index=queue_index, deadline=deadline, first=first)

    def _poll_open(self, *, wait_s: float, queue_index: int | None, deadline: float | None,
                   first: bool = False) -> int:
        """``ResultCollector.poll``, without the queues found removed on the way (the table
        marks them; a closed pool still raises :class:`PoolClosedError`)."""
        while True:
            if queue_index is not None and queue_index in self.removed:
                queue_index = None  # its records went to another queue: read them all
            before = len(self.removed)
            try:
                return super().poll(wait_s=wait_s, queue_index=queue_index, deadline=deadline, first=first)
            except PoolClosedError:
                raise
            except QueueClosedError:
                if len(self.removed) == before:  # not a removed queue: the caller's error
                    raise


def apply_entry(pool: Any, entry: dict[str, Any], handle_of: Callable[[Any], Any]) -> bool:
    """Bring attached handle ``pool`` (its table, collector and router) up to its pool's
    registry ``entry``; ``handle_of(ref)`` makes a queue handle from a registry ref. Returns
    whether the queues it routes to changed. Runs with the collector's lock held."""
    table, collector, router = pool.table, pool.collector, pool.router
    refs = {int(i): ref for i, ref in (entry.get("queues") or {}).items()}
    removed = {int(i) for i in entry.get("removed") or ()}
    resting = {int(i) for i in entry.get("resting") or ()}
    n = max(int(entry.get("n_queues") or 0), 1 + max(refs, default=-1), 1 + max(removed, default=-1),
            1 + max(resting, default=-1))
    old = len(table.handles)
    if n > old:
        table.grow([NoQueue(q) for q in range(old, n)], [None] * (n - old))
        collector.add_queues(n - old)
        for q in range(old, n):  # not routed to until it serves
            table.removed.add(q)
            collector.removed.add(q)
    for q in range(n):
        if q in removed:
            if q not in table.removed:
                pool.forget_queue(q)
            else:
                collector.removed.add(q)
        elif q in refs and (q in table.removed or q in table.resting or _moved(table.handles[q], refs[q])):
            table.serve(q, handle_of(refs[q]))  # added since, serving again or moved: use it
            table.removed.discard(q)
            collector.removed.discard(q)
        elif q in resting and q not in refs:  # its state waits in the owner's client: wait for it
            table.rest(q)
            table.removed.discard(q)
            collector.removed.discard(q)
    draining = {int(i) for i in entry.get("draining") or ()}  # still polled, not routed to
    targets = [q for q in range(n) if q not in table.removed and q not in draining]
    if targets and targets != sorted(router.targets):
        router.route_to(targets)
        logger.info("%r follows its pool's queues: routing to %s", pool, targets)
        return True
    return False


def _moved(handle: Any, ref: Any) -> bool:
    """Whether registry ``ref`` names another actor than ``handle``."""
    return (handle.key, handle._address) != (ref[2], ref[1])


class _AttachedDemand:
    """Who asks the scheduler for a worker for an attached handle's resting queues: a demand
    under a name of its own, so that each withdraws only its own (the owner's stays)."""

    def __init__(self, pool: Any) -> None:
        self.client = pool.client
        self.name = f"{pool.name} (attached {uuid.uuid4().hex[:12]})"  # one per handle

    def __repr__(self) -> str:
        return f"<attached handle {self.name!r}>"


def follower_of(pool: Any, read_entry: Callable[[], dict[str, Any] | None],
                handle_of: Callable[[Any], Any]) -> Callable[[], bool]:
    """``follow()`` for attached handle ``pool``: at most once per ``FOLLOW_S`` (and only if
    no other thread is reading it: it tries again later), read the registry
    entry with ``read_entry()`` and apply it. True when it read it. Never raises: a registry
    that cannot be read, or a pool no longer registered, is for the calls to report.
    Its table learns from the entry which queues rest, and asks for a worker for them."""
    table = pool.table
    table.resting_by_owner = lambda q: q in ((read_entry() or {}).get("resting") or ())
    table.demand = Demand(_AttachedDemand(pool), table.resting)
    last = [time.monotonic()]  # just attached: the entry was read then

    reading = threading.Lock()  # one reader at a time; never the collector's lock (below)

    def follow() -> bool:
        if pool.closed or time.monotonic() - last[0] < FOLLOW_S:
            return False
        if not reading.acquire(blocking=False):
            return False
        try:
            last[0] = time.monotonic()
            try:
                # Read without the collector's lock: it is never held across a network wait
                # (a scheduler round trip here stalled every thread filing this handle's outcomes).
                entry = read_entry()
            except Exception as e:  # the registry is for finding pools: try again later
                logger.debug("%r: registry not read: %s", pool, e)
                return True
            if entry is not None and "config" in entry:
                with pool.collector.exclusive():
                    apply_entry(pool, entry, handle_of)
            return True
        finally:
            reading.release()

    return follow
