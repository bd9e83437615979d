"""Results by producer, queue side: which producer handle reads the outcome of which message.

Every put carries a producer tag (0: the pool's owner; an attached handle's own tag; a
follow-up enqueued from inside a task carries its parent's tag, see :mod:`daskqueue.producers`).
The tag rides on the chunk's meta, so a settle knows whose outcomes it stores: a lease whose
spans come from puts of several producers gives one result record per producer, and each
producer's fetches return only its own records (:mod:`daskqueue.queue.outbox`).

Pure functions and one small bounded table: no Dask, no clock, no I/O.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from typing import Any, Iterable

from daskqueue.serialize import PROTOCOL, ResultRecord, TaggedResultRecord

__all__ = ["span_producers", "split_by_producer", "EarlyProducers", "record_producer"]

#: How many early-acked spans of non-owner producers a queue remembers until their outcomes
#: arrive (``record_outcomes``); an outcome never recorded (its consumer died) is forgotten
#: oldest first beyond this.
EARLY_SPANS_KEPT = 100_000


def record_producer(record: Any) -> int:
    """The producer tag of a result record (0 for records of older layouts)."""
    return getattr(record, "producer", 0) or 0


def span_producers(spans: Iterable[Any], n: int) -> list[int]:
    """The producer tag of each of the first ``n`` spans (of a lease, in lease order)."""
    out = []
    for span in spans:
        if len(out) == n:
            break
        out.append(getattr(span.chunk.meta, "producer", 0) or 0)
    return out


def split_by_producer(record: ResultRecord, producers: list[int]) -> list[ResultRecord | TaggedResultRecord]:
    """``record`` as one record per producer: ``producers[i]`` is the tag of ``record.ranges[i]``.

    The usual case, one producer, costs nothing (the record is returned with its tag). Mixed
    producers need the results list unpickled to be cut; if it cannot be unpickled here, the
    whole record goes to the first range's producer (logged by the caller), so no outcome is
    dropped, though another producer may then wait for its own in vain.
    """
    first = producers[0] if producers else 0
    if all(p == first for p in producers):
        return [record.tagged(first)]
    values = pickle.loads(record.results)
    failed, finals = set(record.failed), record.final_errors or {}
    by: dict[int, tuple[list[tuple[int, int]], list[int], list[Any], dict[int, bytes]]] = {}
    pos = 0
    for (seq, count), producer in zip(record.ranges, producers):
        ranges, fails, vals, errs = by.setdefault(producer, ([], [], [], {}))
        ranges.append((seq, count))
        for k in range(pos, pos + count):
            if k in failed:
                fails.append(len(vals))
            if k in finals:
                errs[len(vals)] = finals[k]
            vals.append(values[k])
        pos += count
    return [ResultRecord(record.queue, ranges, fails, pickle.dumps(vals, PROTOCOL),
                         (errs or None) if record.final_errors is not None else None, record.consumer).tagged(producer)
            for producer, (ranges, fails, vals, errs) in by.items()]


class EarlyProducers:
    """The producers of early-acked spans whose outcomes are still to come.

    An early-acked lease is settled before it runs; its outcomes arrive later by
    ``record_outcomes`` with bare ``(first_seq, count)`` ranges. Only spans of a producer
    other than the owner are remembered (a pool with one producer keeps nothing), bounded.
    """

    def __init__(self, max_entries: int = EARLY_SPANS_KEPT) -> None:
        self._by_seq: OrderedDict[int, int] = OrderedDict()
        self._max = max_entries

    def __len__(self) -> int:
        return len(self._by_seq)

    def note(self, spans: Iterable[Any], n: int) -> None:
        """The first ``n`` spans of a lease were acked early: remember their producers."""
        for span, producer in zip(spans, span_producers(spans, n)):
            if producer:
                self._by_seq[span.first_seq] = producer
        while len(self._by_seq) > self._max:
            self._by_seq.popitem(last=False)

    def take(self, ranges: list[tuple[int, int]]) -> list[int]:
        """The producer of each range (0 if not remembered), forgetting them."""
        if not self._by_seq:
            return [0] * len(ranges)
        return [self._by_seq.pop(seq, 0) for seq, _ in ranges]
