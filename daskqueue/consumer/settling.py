"""Settling a consumer's leases: acks with outcomes, early acks, lease extension.

Delivery is settled in one place: :meth:`Settler.settle` acks the messages that ran (their
results and errors ride on the ack) and gives the rest back to the front of their queue,
attempts unchanged. With ``early_ack`` a batch is acked before it runs and its outcomes are
recorded afterwards (:meth:`Settler.record`). Leases still held are extended every third of
the lease timeout. Event-loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from daskqueue.consumer.batch import Batch, Outcome, dump_results
from daskqueue.consumer.calls import QueueCalls
from daskqueue.consumer.counters import Counters
from daskqueue.errors import LeaseExpiredError
from daskqueue.serialize import encode_settle

__all__ = ["Settler"]

logger = logging.getLogger("daskqueue")

#: An extend call's deadline, as a share of the period between extensions (see extend_forever).
EXTEND_DEADLINE_SHARE = 0.8


class Settler:
    """Settles and extends the leases of one consumer through ``calls``; counts what was
    settled in ``counters``. ``held()`` lists the ``(slot, lease_id)`` pairs still held."""

    def __init__(self, index: int, calls: QueueCalls, counters: Counters, *, lease_timeout_s: float,
                 held: Callable[[], list[tuple[int, int]]]) -> None:
        self.index = index
        self._calls = calls
        self._counters = counters
        self._lease_timeout_s = lease_timeout_s
        self._held = held

    async def settle(self, batch: Batch, outcome: Outcome, *, early: bool) -> None:
        """Ack what ran of ``batch`` (all of it, unrun, when ``early``), give the rest back.
        The results were pickled where the batch ran (``outcome.results_blob``)."""
        results = None if early else dump_results(outcome)
        blob = encode_settle(outcome.done, outcome.errors, outcome.fatal, results, self.index)
        try:
            await self._calls.call_moving(batch.queue_slot, "settle", batch.lease_id, blob)
        except LeaseExpiredError:
            self._counters.refused_settlements += 1
            logger.warning(
                "consumer %d: lease %d expired before it was settled; the queue redelivered "
                "its %d messages and refused this outcome", self.index, batch.lease_id, batch.count,
            )
            return
        if not early:
            self._counters.count(outcome.done, len(outcome.errors))

    async def give_back(self, slot: int, lease_id: int) -> None:
        """Give back a lease whose messages never started (its fetch failed or was given
        up): they go back to the front of their queue at once, attempts unchanged, as
        fetched-but-unstarted messages do on ``stop`` (a settlement of which nothing ran).
        If that fails too, the lease expires at the queue, which counts an attempt."""
        blob = encode_settle(0, {}, set(), None, self.index)
        try:
            await self._calls.call_moving(slot, "settle", lease_id, blob)
        except Exception as e:
            logger.warning("consumer %d: giving back lease %d failed (%s: %s); it will expire",
                           self.index, lease_id, type(e).__name__, e)

    async def record(self, batch: Batch, outcome: Outcome) -> None:
        """The outcomes of an early-acked ``batch`` that ran."""
        ranges, producers = [], []
        left = outcome.done
        for seg in batch.segments:
            if left <= 0:
                break
            ranges.append((seg.first_seq, min(seg.count, left)))
            producers.append(seg.producer)  # whose outcomes: the queue keeps no note of it
            left -= seg.count
        await self._calls.call_moving(batch.queue_slot, "record_outcomes", ranges, outcome.errors,
                                      dump_results(outcome), self.index, producers)
        self._counters.count(outcome.done, len(outcome.errors))

    async def extend_forever(self) -> None:
        """Every third of the lease timeout, extend the leases of the batches still held.

        Each queue's leases are extended by a call of their own, with a deadline of most of
        that period: a slow or silent queue delays only its own leases, never another
        queue's. A queue whose last call has not ended yet is not called again meanwhile; a
        call given up has ended before the next tick (its deadline is shorter than the
        period), which calls that queue again: a lease then misses one extension, not two
        (with a whole period's deadline, the call ended just after that tick, and the lease
        went unextended for two periods of its three)."""
        period = self._lease_timeout_s / 3
        deadline_s = EXTEND_DEADLINE_SHARE * period
        calls: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                await asyncio.sleep(period)
                for slot, lease_ids in self._held_by_slot().items():
                    if slot not in calls or calls[slot].done():
                        calls[slot] = asyncio.get_running_loop().create_task(self._extend(slot, lease_ids, deadline_s))
        finally:  # the calls end with the extender: each logs its own failure
            for call in calls.values():
                call.cancel()
            await asyncio.gather(*calls.values(), return_exceptions=True)

    def _held_by_slot(self) -> dict[int, list[int]]:
        by_slot: dict[int, list[int]] = {}
        for slot, lease_id in self._held():
            by_slot.setdefault(slot, []).append(lease_id)
        return by_slot

    async def _extend(self, slot: int, lease_ids: list[int], deadline_s: float) -> None:
        try:
            lost = await self._calls.call(slot, "extend", lease_ids, deadline_s=deadline_s)
        except Exception as e:  # one queue's failure must not end the extender
            logger.warning("consumer %d: extending leases at queue %d failed: %s: %s",
                           self.index, slot, type(e).__name__, e)
            return
        if lost:
            logger.warning("consumer %d: leases %s had already expired", self.index, lost)
