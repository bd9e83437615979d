"""Results by producer, queue side: which producer handle reads the outcome of which message.

Every put carries a producer tag (0: the pool's owner; an attached handle's own tag; a
follow-up enqueued from inside a task carries its parent's tag, see :mod:`daskqueue.producers`).
The tag rides on the chunk's meta, so a settle knows whose outcomes it stores: a lease whose
spans come from puts of several producers gives one result record per producer, and each
producer's fetches return only its own records (:mod:`daskqueue.queue.outbox`). The
consumer cuts the results by producer where they are still values (:func:`split_values`),
so the queue never unpickles a user's result.

Pure functions: no Dask, no clock, no I/O.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Union

from daskqueue.serialize import ResultRecord, TaggedResultRecord

__all__ = ["span_producers", "segment_producers", "split_values", "split_by_producer", "record_producer"]

logger = logging.getLogger("daskqueue")

#: A results field of a settle or ``record_outcomes``: one pickled list for all the ranges,
#: or (ranges of several producers) one pickled list per producer tag, cut by the consumer.
Results = Union[bytes, dict[int, bytes]]


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


def segment_producers(segments: Iterable[Any]) -> list[tuple[int, int]] | None:
    """``(producer, count)`` of each segment of a delivery, or None if they all have one
    producer (the usual case: the results stay one list)."""
    pairs = [(getattr(seg, "producer", 0) or 0, seg.count) for seg in segments]
    if len({p for p, _ in pairs}) <= 1:
        return None
    return pairs


def split_values(values: list[Any], producers: list[tuple[int, int]]) -> dict[int, list[Any]]:
    """``values`` (one per message that ran, in delivery order; fewer than the delivery's
    messages when a batch stopped early) cut by producer: ``producers`` is
    :func:`segment_producers`. Runs in the consumer, where the results are still values."""
    by: dict[int, list[Any]] = {}
    pos = 0
    for producer, count in producers:
        if pos >= len(values):
            break
        by.setdefault(producer, []).extend(values[pos : pos + count])
        pos += count
    return by


def split_by_producer(record: ResultRecord, producers: list[int]) -> list[ResultRecord | TaggedResultRecord]:
    """``record`` as one record per producer: ``producers[i]`` is the tag of ``record.ranges[i]``.

    Never unpickles a result (that is user code, and this runs on the queue's event loop):
    ``record.results`` of ranges of several producers is the consumer's cut, a dict of one
    pickled list per producer (:func:`split_values`). A single blob for mixed producers (a
    consumer that could not cut it) goes whole to the first range's producer, logged: no
    outcome is dropped, though another producer then waits for its own in vain.
    """
    first = producers[0] if producers else 0
    results = record.results
    if all(p == first for p in producers) or not isinstance(results, dict):
        if isinstance(results, dict):  # one producer's cut
            results = results.get(first, next(iter(results.values()), b""))
        elif not all(p == first for p in producers):
            logger.warning("queue %d: results of %d producers' messages came as one list; "
                           "all go to producer %d", record.queue, len(set(producers)), first)
        return [record._replace(results=results).tagged(first)]
    failed, finals = set(record.failed), record.final_errors or {}
    by: dict[int, tuple[list[tuple[int, int]], list[int], dict[int, bytes], list[int]]] = {}
    pos = 0
    for (seq, count), producer in zip(record.ranges, producers):
        ranges, fails, errs, n = by.setdefault(producer, ([], [], {}, [0]))
        ranges.append((seq, count))
        for k in range(pos, pos + count):
            if k in failed:
                fails.append(n[0])
            if k in finals:
                errs[n[0]] = finals[k]
            n[0] += 1
        pos += count
    return [ResultRecord(record.queue, ranges, fails, results.get(producer, b""),
                         (errs or None) if record.final_errors is not None else None, record.consumer).tagged(producer)
            for producer, (ranges, fails, errs, _) in by.items()]
