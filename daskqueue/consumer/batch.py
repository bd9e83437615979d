"""What a consumer fetches and what running it gives: :class:`Batch` and :class:`Outcome`.

A neutral module: the consumer actor (``daskqueue.consumer.base``) and its child process
(``daskqueue.consumer.child``) both use it, and it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from daskqueue.messages import error_from_exception
from daskqueue.queue.producer_results import split_values
from daskqueue.serialize import Segment, dumps

__all__ = ["Batch", "Outcome", "dump_results", "batch_to_child", "batch_from_parent"]


@dataclass(slots=True, eq=False)
class Batch:
    """A fetched delivery: the lease, the queue it came from, and its segments."""

    queue_slot: int  # the index of the queue it was leased from
    queue_index: int
    lease_id: int
    segments: list[Segment]
    count: int
    reserved: bool = False  # fetched by a reserved slot (urgent work): not a batch-size sample
    #: digest -> pickled function, for each function its segments name: the batch runs from
    #: these if the consumer's bounded function cache evicted one meanwhile. None when the
    #: batch travels to a child process (which is sent only the functions it lacks).
    funcs: dict[bytes, bytes] | None = None


def batch_to_child(batch: Batch) -> tuple[Any, ...]:
    """``batch`` as the parent sends it to its child process: plain tuples, without the
    functions (the child is sent only those it lacks). A dataclass and named tuples pickle
    by reference (a module look-up and a Python call each, per batch and segment, on every
    single task's path); plain tuples do not."""
    return (batch.queue_slot, batch.queue_index, batch.lease_id, [tuple(s) for s in batch.segments],
            batch.count, batch.reserved)


def batch_from_parent(frame: tuple[Any, ...]) -> Batch:
    """The :class:`Batch` that :func:`batch_to_child` sent."""
    slot, index, lease_id, segments, count, reserved = frame
    return Batch(slot, index, lease_id, [Segment._make(s) for s in segments], count, reserved)


@dataclass(slots=True, eq=False)
class Outcome:
    """What running a batch gave: ``done`` messages ran; failures by position; results
    (as values, or already pickled in ``results_blob`` when a child process ran them)."""

    done: int
    errors: dict[int, bytes]
    fatal: set[int]
    results: list[Any]
    #: The pickled results: one list, or one list per producer tag when the batch's segments
    #: came from several producers (``producers``; the queue never unpickles results to cut them).
    results_blob: bytes | dict[int, bytes] | None = None
    #: ``(producer, count)`` per segment when they differ (:func:`segment_producers`), else None.
    producers: list[tuple[int, int]] | None = None


def dump_results(outcome: Outcome) -> bytes | dict[int, bytes]:
    """Pickle the results (once: the blob is kept in ``outcome.results_blob``); one that
    cannot be pickled becomes that message's error, fatal (pickling it again fails again).
    Results of several producers (``outcome.producers``) are pickled as one list each.

    Runs user code (``__reduce__``) and may take long for large results: call it on the
    thread that ran the batch, never on the event loop."""
    if outcome.results_blob is not None:
        return outcome.results_blob
    try:
        blob = _dump(outcome)
    except Exception:
        for pos, value in enumerate(outcome.results):
            try:
                dumps(value)
            except Exception as e:
                outcome.errors[pos] = error_from_exception(e)
                outcome.fatal.add(pos)
                outcome.results[pos] = None
        blob = _dump(outcome)
    outcome.results_blob = blob
    return blob


def _dump(outcome: Outcome) -> bytes | dict[int, bytes]:
    if outcome.producers is None:
        return dumps(outcome.results)
    return {p: dumps(values) for p, values in split_values(outcome.results, outcome.producers).items()}
