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
            self._counters.refused += 1
            logger.warning(
                "consumer %d: lease %d expired before it was settled; the queue redelivered "
                "its %d messages and refused this outcome", self.index, batch.lease_id, batch.count,
            )
            return
        if not early:
            self._counters.count(outcome.done, len(outcome.errors))

    async def record(self, batch: Batch, outcome: Outcome) -> None:
        """The outcomes of an early-acked ``batch`` that ran."""
        ranges = []
        left = outcome.done
        for seg in batch.segments:
            if left <= 0:
                break
            ranges.append((seg.first_seq, min(seg.count, left)))
            left -= seg.count
        await self._calls.call_moving(batch.queue_slot, "record_outcomes", ranges, outcome.errors,
                                      dump_results(outcome), self.index)
        self._counters.count(outcome.done, len(outcome.errors))

    async def extend_forever(self) -> None:
        """Every third of the lease timeout, extend the leases of the batches still held."""
        period = self._lease_timeout_s / 3
        while True:
            await asyncio.sleep(period)
            by_slot: dict[int, list[int]] = {}
            for slot, lease_id in self._held():
                by_slot.setdefault(slot, []).append(lease_id)
            for slot, lease_ids in by_slot.items():
                try:
                    lost = await self._calls.call(slot, "extend", lease_ids)
                except Exception as e:  # one queue's failure must not end the extender
                    logger.warning("consumer %d: extending leases failed: %s: %s",
                                   self.index, type(e).__name__, e)
                    continue
                if lost:
                    logger.warning("consumer %d: leases %s had already expired", self.index, lost)
