"""Results by producer, queue side: which producer handle reads the outcome of which message.

Every put carries a producer tag (0: the pool's owner; an attached handle's own tag; a
follow-up enqueued from inside a task carries its parent's tag, see :mod:`daskqueue.producers`).
The tag rides on the chunk's meta, so a settle knows whose outcomes it stores: a lease whose
spans come from puts of several producers gives one result record per producer, and each
producer's fetches return only its own records (:mod:`daskqueue.queue.outbox`). The
consumer cuts the results by producer where they are still values (:func:`split_values`),
so the queue never unpickles a user's result.

Pure functions and a bookkeeping class: no Dask, no clock, no I/O.
"""

from __future__ import annotations

import bisect
import logging
import pickle
from typing import Any, Iterable, Union

from daskqueue.serialize import PROTOCOL, ResultRecord, TaggedResultRecord

__all__ = ["span_producers", "segment_producers", "split_values", "split_by_producer", "record_producer",
           "ProducerBook", "PRODUCER_LIVENESS_S", "MOVED_RECORD", "moved_record", "is_moved_record", "moved_runs",
           "AdoptedRuns"]

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


#: An attached producer neither putting nor fetching for this long is gone (a crashed
#: process, a killed task's handle): its records are dropped. Renewed by each put and fetch;
#: the owner (tag 0) never expires. Minutes: far above a collector's long-poll period.
PRODUCER_LIVENESS_S = 600.0

#: How many forgotten producer tags a queue remembers (to drop their late records at once).
FORGOTTEN_KEPT = 10_000


class ProducerBook:
    """Which producers read a queue's result records, and how far each has read.

    Per producer tag: its cursor (the first record number it has not fetched) and when it
    was last heard of (a put or a fetch; ``now`` is given, this class reads no clock). A
    record is *wanted* while its producer is known and has not fetched past it; a producer
    is forgotten when it says so (an attached handle closed) or after ``liveness_s`` unheard
    of (never the owner, 0). Pure: no Dask, no clock, no I/O.
    """

    def __init__(self, liveness_s: float = PRODUCER_LIVENESS_S) -> None:
        self.liveness_s = liveness_s
        self.cursors: dict[int, int] = {}
        self.heard: dict[int, float] = {}
        self.forgotten: dict[int, None] = {}  # insertion-ordered set, oldest first

    def hear(self, producer: int, now: float) -> bool:
        """Producer ``producer`` put or fetched now. True if it had been forgotten (its
        earlier unfetched records are gone)."""
        if not producer:
            return False
        back = self.forgotten.pop(producer, 0) is None
        self.heard[producer] = now
        return back

    def notice(self, producer: int, now: float) -> None:
        """A record of ``producer`` is stored: its liveness counts from now if it is new."""
        if producer and producer not in self.heard and producer not in self.forgotten:
            self.heard[producer] = now

    def fetched(self, producer: int, cursor: int) -> None:
        if cursor > self.cursors.get(producer, 0):
            self.cursors[producer] = cursor

    def forget(self, producer: int) -> None:
        if not producer:
            return
        self.cursors.pop(producer, None)
        self.heard.pop(producer, None)
        self.forgotten[producer] = None
        while len(self.forgotten) > FORGOTTEN_KEPT:
            del self.forgotten[next(iter(self.forgotten))]

    def expire(self, now: float) -> list[int]:
        """Forget the producers unheard of for longer than ``liveness_s``; return them."""
        gone = [p for p, t in self.heard.items() if now - t > self.liveness_s]
        for p in gone:
            self.forget(p)
        return gone

    def wanted(self, record: Any, number: int) -> bool:
        """Whether record ``number`` is still to be fetched by its producer."""
        if not record.ranges:  # an empty record (a dropped one's place): nobody's
            return False
        producer = record_producer(record)
        return producer not in self.forgotten and number >= self.cursors.get(producer, 0)

    def export(self, now: float) -> dict[str, Any]:
        """The state for a successor (hand-off): ages, not this process's clock readings."""
        return {"cursors": dict(self.cursors), "ages": {p: now - t for p, t in self.heard.items()},
                "forgotten": list(self.forgotten)}

    def load(self, state: dict[str, Any], now: float) -> None:
        self.cursors = dict(state["cursors"])
        self.heard = {p: now - age for p, age in state["ages"].items()}
        self.forgotten = dict.fromkeys(state["forgotten"])


# -- moved messages of attached producers ---------------------------------------------------------

#: The ``consumer`` field of a *moved record*: a result record that carries no outcome but tells
#: its producer where some of its messages moved (see :func:`moved_record`). Consumer indices
#: are never negative, so no outcome record has it.
MOVED_RECORD = -1

#: A moved run: ``(given first seq, count, given queue, new first seq)``: messages ``new first
#: seq ..`` of the record's queue were given the ids ``(given queue, given first seq ..)``.
MovedRun = tuple[int, int, int, int]


def moved_record(queue: int, producer: int, runs: list[MovedRun]) -> TaggedResultRecord:
    """A record for producer ``producer`` (never 0: the owner learns its moves from the calls
    it makes) saying that messages it was given ids for now live in ``queue`` at the new seqs
    of ``runs``. Stored in ``queue``'s outbox before any of those messages can be delivered, so
    the producer reads it before any of their outcomes (its records come in number order).

    It is an ordinary tagged result record (``ranges``: the new ranges, so the outbox keeps
    and drops it like an outcome record, on disk too; ``results``: the pickled runs;
    ``consumer``: :data:`MOVED_RECORD`), so no stored layout changes."""
    return TaggedResultRecord(queue, [(run[3], run[1]) for run in runs], [],
                              pickle.dumps([tuple(run) for run in runs], PROTOCOL), None, MOVED_RECORD, producer)


def is_moved_record(record: Any) -> bool:
    """Whether ``record`` is a :func:`moved_record` (no outcomes in it)."""
    return getattr(record, "consumer", None) == MOVED_RECORD


def moved_runs(record: Any) -> list[MovedRun]:
    """The runs of a :func:`moved_record`."""
    return [tuple(run) for run in pickle.loads(record.results)]  # type: ignore[misc]


#: How many adopted runs a queue remembers the given ids of (see :class:`AdoptedRuns`).
ADOPTED_KEPT = 100_000


class AdoptedRuns:
    """The given ids of messages of attached producers that moved into a queue: per run, new
    first seq -> ``(count, given queue, given first seq)``. When such a message moves on, its
    next moved record names the id it was given, not its seq here, so the producer never needs
    the records of the queues in between (which may be removed before it reads them).

    Bounded (``ADOPTED_KEPT`` runs, the oldest go first); in memory only: a run forgotten (or
    lost with a reopen) makes the next record name this queue's seq, which the producer still
    follows through this queue's own moved record. Pure: no Dask, no clock, no I/O.
    """

    def __init__(self, kept: int = ADOPTED_KEPT) -> None:
        self.kept = kept
        self._starts: list[int] = []
        self._runs: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, new_first: int, count: int, given_queue: int, given_first: int) -> None:
        i = bisect.bisect(self._starts, new_first)
        self._starts.insert(i, new_first)
        self._runs.insert(i, (count, given_queue, given_first))
        if len(self._starts) > self.kept:  # seqs grow: the lowest are the oldest
            del self._starts[0], self._runs[0]

    def given(self, queue: int, seq: int) -> tuple[int, int]:
        """``(queue, seq)`` of the id message ``seq`` of this queue (``queue``) was given."""
        i = bisect.bisect(self._starts, seq) - 1
        if i >= 0:
            count, given_queue, given_first = self._runs[i]
            if seq < self._starts[i] + count:
                return given_queue, given_first + seq - self._starts[i]
        return queue, seq
