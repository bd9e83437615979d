"""Where a consumer fetches from: the fetch policy.

Home queue first; then the queues the home queue last said have work (hints, which the
queues tell each other); a long poll of home when there is nothing to do, so that an idle
consumer makes one call per ``idle_poll_s`` however many queues there are. A queue that
fails is skipped for ``QUEUE_RETRY_S``; an announcement found stale (the queue was drained
by another consumer since) is ignored for a poll interval. What is known of a queue that
moved (reopened or handed off elsewhere) is of its old actor: a failure of a call made to
the old one does not make the new one skipped. Event-loop only.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from daskqueue.consumer.batch import Batch
from daskqueue.consumer.calls import QueueCalls
from daskqueue.consumer.counters import Counters
from daskqueue.consumer.settling import Settler
from daskqueue.consumer.sizer import BatchSizer
from daskqueue.lru import LRU
from daskqueue.serialize import decode_delivery

__all__ = ["FetchPolicy", "QUEUE_RETRY_S"]

logger = logging.getLogger("daskqueue")

#: How long a consumer leaves a queue alone after a call to it failed.
QUEUE_RETRY_S = 5.0


class _Hints:
    """One kind of slot's hints: the (queue, announcement) pairs the home queue last said
    have work, and the announcements found stale, ignored until the time given."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, int]] = []
        self.stale: dict[tuple[int, int], float] = {}


class FetchPolicy:
    """Fetches batches for the general slots (:meth:`fetch`) and the reserved ones
    (:meth:`fetch_urgent`), asking the queues of ``calls`` in the order the policy says.

    ``func_bytes`` (digest -> pickled function, a bounded :class:`~daskqueue.lru.LRU`) is
    filled with the functions a fetched batch needs, and the batch keeps its own (``funcs``); ``stopping()`` says when to give up a round early. A delivery that cannot start
    (its functions could not be fetched, or it arrived after its fetch gave up) is given
    back through ``settler``: no attempt counts for messages that never ran.
    """

    def __init__(self, index: int, calls: QueueCalls, sizer: BatchSizer, counters: Counters,
                 settler: Settler, *,
                 home: int, idle_poll_s: float, reserved_priority: int,
                 func_bytes: LRU[bytes, bytes], stopping: Callable[[], bool]) -> None:
        self.index = index
        self._calls = calls
        self._sizer = sizer
        self._counters = counters
        self._settler = settler
        self._idle_poll_s = idle_poll_s
        self._reserved_priority = reserved_priority
        self._func_bytes = func_bytes
        self._stopping = stopping
        self.owner: str | None = None  # this consumer's worker: the owner of its leases
        self.home = home
        self._order: list[int] = []
        self._general, self._reserved = _Hints(), _Hints()
        self._home_idle = self._reserved_idle = False
        self._down_until: dict[int, float] = {}  # queue index -> monotonic time to retry
        self._moves: dict[int, int] = {}  # queue index -> how many times it moved (queue_back)
        self.set_home(home)

    def set_home(self, home: int) -> None:
        """Ask ``home`` first, then the next indices in turn: an idle consumer takes their work."""
        queues = self._calls.queues
        self._general.pending, self._reserved.pending = [], []
        if not queues:  # a child process's twin, which calls no queue
            self._order = []
            return
        if home not in queues:
            raise ValueError(f"home queue {home} is not one of the queues {sorted(queues)}")
        self.home = home
        idx = sorted(queues)
        k = idx.index(home)
        self._order = idx[k:] + idx[:k]
        for i in [i for i in self._down_until if i not in queues]:
            del self._down_until[i]
        for i in [i for i in self._moves if i not in queues]:
            del self._moves[i]

    def queue_back(self, slot: int) -> None:
        """Queue ``slot`` is usable again (it moved): stop skipping it, and take no failure
        of a call made before the move for one of its new actor."""
        self._down_until.pop(slot, None)
        self._moves[slot] = self._moves.get(slot, 0) + 1

    async def fetch(self, limit: int | None = None) -> Batch | None:
        """One fetch for the general slots: the hinted queues, then a long poll of home
        (which answers with a batch, or at once with where work is elsewhere). With the
        home queue failing, the others are asked in turn. ``limit``: at most that many
        messages, whatever the sizer says (the walltime's limit)."""
        n = self._sizer.size
        sizes = self._sizer.sizes_by_type()
        if limit is not None:
            n = max(1, min(n, limit))
            if sizes is not None:
                sizes = {t: min(size, n) for t, size in sizes.items()}
        if len(self._calls.queues) > 1 and not self.is_down(self.home):
            return await self._fetch_hinted(n, sizes, None)
        # Right after a long poll of the home queue timed out, asking it again is wasted.
        slot, blob = await self._round(n, sizes, None, skip_home=self._home_idle)
        if slot is not None:
            self._home_idle = False
            return await self._decode(slot, blob)
        if blob is _STOPPED or await self._home_down():
            return None
        blob = await self._get_from(self.home, n, self._idle_poll_s, None, sizes)
        self._home_idle = blob is None
        return await self._decode_or_idle(blob)

    async def fetch_urgent(self) -> Batch | None:
        """A reserved slot's fetch: one message of priority >= ``reserved_priority``, from
        where the home queue last said urgent work is, else from a long poll of home (which
        answers at once with peers that announced urgent work)."""
        prio = self._reserved_priority
        if len(self._calls.queues) > 1 and not self.is_down(self.home):
            return await self._fetch_hinted(1, None, prio)
        slot, blob = await self._round(1, None, prio, skip_home=self._reserved_idle)
        if slot is not None:
            self._reserved_idle = False
            return await self._decode(slot, blob, reserved=True)
        if blob is _STOPPED or await self._home_down():
            return None
        blob = await self._get_from(self.home, 1, self._idle_poll_s, prio)
        self._reserved_idle = blob is None
        return None if blob is None else await self._decode(self.home, blob, reserved=True)

    async def _round(self, n: int, sizes: dict[str | None, int] | None, min_priority: int | None,
                     *, skip_home: bool) -> tuple[int | None, Any]:
        """Ask every queue in order without waiting: ``(slot, blob)`` of the first with
        work, ``(None, _STOPPED)`` if stopping, else ``(None, None)``."""
        for slot in self._order[1 if skip_home else 0:]:
            blob = await self._get_from(slot, n, 0.0, min_priority, sizes)
            if blob is not None:
                return slot, blob
            if self._stopping():
                return None, _STOPPED
        return None, None

    async def _home_down(self) -> bool:
        """Whether the home queue is down; then wait a poll interval (nothing to long-poll)."""
        if not self.is_down(self.home):
            return False
        await asyncio.sleep(self._idle_poll_s)
        return True

    async def _decode_or_idle(self, blob: bytes | None) -> Batch | None:
        if blob is None:
            self._sizer.idle()
            return None
        return await self._decode(self.home, blob)

    async def _fetch_hinted(self, n: int, sizes: dict[str | None, int] | None,
                            min_priority: int | None) -> Batch | None:
        """The general slots' fetch (``min_priority`` None) or a reserved slot's: each keeps
        its own hints and stale announcements."""
        reserved = min_priority is not None
        hints = self._reserved if reserved else self._general
        now = time.monotonic()
        pending, hints.pending = hints.pending, []
        for index, number in pending:
            slot = index
            if slot == self.home or slot not in self._calls.queues:
                continue
            if self.is_down(slot):  # not until it is back: the home queue would say it again at once
                hints.stale[(index, number)] = self._down_until[slot]
                continue
            blob = await self._get_from(slot, n, 0.0, min_priority, sizes)
            if blob is not None:
                return await self._decode(slot, blob, reserved=reserved)
            # Drained by another consumer since: ignore this announcement (not the queue's
            # next one) for a poll interval, in case its "no work" never comes.
            hints.stale[(index, number)] = now + self._idle_poll_s
            if self._stopping():
                return None
        for w in [w for w, until in hints.stale.items() if until <= now]:
            del hints.stale[w]
        answer = await self._get_from(self.home, n, self._idle_poll_s, min_priority, sizes,
                                      hints=True, ignore=list(hints.stale))
        if isinstance(answer, list):
            hints.pending = answer
            return None
        if reserved:
            return None if answer is None else await self._decode(self.home, answer, reserved=True)
        return await self._decode_or_idle(answer)

    def is_down(self, slot: int) -> bool:
        until = self._down_until.get(slot)
        return until is not None and time.monotonic() < until

    async def _get_from(self, slot: int, n: int, wait_s: float, min_priority: int | None = None,
                        sizes: dict[str | None, int] | None = None, hints: bool = False,
                        ignore: list[int] | None = None) -> Any:
        """``get_batch`` of one queue; ``None`` if it is empty, down or failing (with
        ``hints``, maybe the list of queues with work instead)."""
        if self.is_down(slot):
            return None
        self._counters.fetch_calls += 1
        moves = self._moves.get(slot, 0)
        try:
            args: tuple[Any, ...] = (n, wait_s, self.owner)
            if min_priority is not None or sizes is not None or hints:
                args += (min_priority, sizes)
            if hints:
                args += (True, ignore or None)
            blob = await self._calls.call(slot, "get_batch", *args, wait_s=wait_s,
                                          on_late=functools.partial(self._give_back_late, slot))
        except Exception as e:
            if self._moves.get(slot, 0) != moves:
                # The call went to the queue's old actor (its worker died, typically): the
                # queue moved meanwhile, and its new actor is not down.
                logger.debug("consumer %d: a call to queue %d failed after it moved (%s: %s)",
                             self.index, slot, type(e).__name__, e)
                return None
            if slot not in self._down_until:
                logger.warning(
                    "consumer %d: queue slot %d failed (%s: %s); skipping it for %g s",
                    self.index, slot, type(e).__name__, e, QUEUE_RETRY_S,
                )
            self._down_until[slot] = time.monotonic() + QUEUE_RETRY_S
            return None
        if self._down_until:
            self._down_until.pop(slot, None)  # back: a new failure is logged again
        return blob

    async def _decode(self, slot: int, blob: bytes, *, reserved: bool = False) -> Batch:
        lease_id, queue_index, segments = decode_delivery(blob)
        # The batch keeps its own functions: the bounded cache may evict one before it runs.
        funcs = {}
        for digest in {s.digest for s in segments if s.digest is not None}:
            data = self._func_bytes.get(digest)
            if data is not None:
                funcs[digest] = data
        missing = [s.digest for s in segments if s.digest is not None and s.digest not in funcs]
        if missing:
            try:
                fetched = await self._calls.call(slot, "get_functions", sorted(set(missing)))
            except Exception:
                await self._settler.give_back(slot, lease_id)
                raise
            funcs.update(fetched)
            self._func_bytes.update(fetched.items())
        return Batch(slot, queue_index, lease_id, segments, sum(s.count for s in segments), reserved, funcs)

    async def _give_back_late(self, slot: int, answer: Any) -> None:
        """The answer of a ``get_batch`` given up at its deadline: a lease nobody will run."""
        if isinstance(answer, bytes):
            lease_id, _, _ = decode_delivery(answer)
            logger.info("consumer %d: lease %d from queue %d arrived after its fetch gave up; "
                        "giving it back", self.index, lease_id, slot)
            await self._settler.give_back(slot, lease_id)


_STOPPED = object()  # a round given up because the consumer stops
