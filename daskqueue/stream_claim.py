"""A claim for ``as_completed(ids)``: the ids' outcomes land in the claim as they are filed.

Filing every outcome in the collector's ``results`` dict (and its arrival log) and popping it
again cost ``as_completed`` most of its client CPU; ``map`` avoids both by claiming its ranges
(:class:`~daskqueue.results.MapClaim`). A :class:`StreamClaim` does the same for a set of ids:
the ids' consecutive runs per queue are claimed, and each arriving outcome is appended to the
claim's ``arrived`` list (by position in ``ids``), which the taker drains a poll at a time, so
memory stays flat. Each position is reported once (at-least-once delivery may file an outcome
twice). Pure: no Dask, no clock, no I/O; the collector calls it under its lock.
"""

from __future__ import annotations

from typing import Any

from daskqueue.errors import RemoteTaskError
from daskqueue.messages import make_id, split_id

__all__ = ["StreamClaim", "id_runs", "hand_over_parked"]


def id_runs(ids: list[int]) -> list[tuple[int, int, int, int]] | None:
    """``(queue, first seq, count, first position)`` of the consecutive runs of ``ids`` (ids of
    consecutive seqs of one queue, in order), or None if two runs overlap (repeated ids)."""
    runs: list[tuple[int, int, int, int]] = []
    n, start = len(ids), 0
    while start < n:
        end = _run_end(ids, start, n)
        runs.append((*split_id(ids[start]), end - start, start))
        start = end
    by_queue: dict[int, list[tuple[int, int]]] = {}
    for q, first, count, _ in runs:
        by_queue.setdefault(q, []).append((first, count))
    for spans in by_queue.values():
        spans.sort()
        for (a, n), (b, _) in zip(spans, spans[1:]):
            if b < a + n:
                return None
    return runs


def _run_end(ids: list[int], start: int, n: int) -> int:
    """The end of the run of consecutive ids that starts at ``start``.

    A run is found by its ends, a few Python steps per run, then checked whole by one list
    comparison in C: a list of ``batch_submit`` ids (a few runs of thousands) costs a copy
    and a compare per id, where a difference per id in Python cost as much as the rest of
    ``as_completed``. The ends are found by galloping then bisecting on "the id at ``k`` is
    ``k - start`` seqs after the first", which holds at both ends of a run but may hold
    past one too; so the run found is checked, and on a mismatch the ids are walked one
    by one up to it (ids that only look consecutive at the ends: rare)."""
    first = ids[start]
    step = 1
    good, bad = start, n  # ids[good] fits the run; ids[bad] does not (or is past the end)
    while good + step < n:
        if ids[good + step] == first + (good + step - start):
            good += step
            step *= 2
        else:
            bad = good + step
            break
    while bad - good > 1:
        middle = (good + bad) // 2
        if ids[middle] == first + (middle - start):
            good = middle
        else:
            bad = middle
    end = good + 1
    if end - start > 1 and ids[start:end] != list(range(first, first + (end - start))):
        end = start + 1
        while end < n and ids[end] == ids[end - 1] + 1:
            end += 1
    return end


class StreamClaim:
    """Outcomes of ``ids`` (distinct) by position, kept only until drained."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.n = len(ids)
        self.settled = 0
        self._done = bytearray(self.n)
        #: ``(first position, values)`` of successes, and ``(position, error)`` of failures,
        #: filed since the last :meth:`drain`.
        self._arrived: list[tuple[int, list[Any]]] = []
        self._failed: list[tuple[int, RemoteTaskError]] = []

    @property
    def complete(self) -> bool:
        return self.settled >= self.n

    def succeed(self, position: int, values: list[Any]) -> None:
        end = position + len(values)
        seen = self._done[position:end].count(1)
        if not seen:
            self._arrived.append((position, values))
        elif seen < end - position:  # some arrived before (at-least-once): the others only
            done = self._done
            self._arrived.extend((position + k, [v]) for k, v in enumerate(values) if not done[position + k])
        else:
            return
        self.settled += end - position - seen
        self._done[position:end] = b"\x01" * (end - position)

    def fail(self, position: int, error: RemoteTaskError) -> None:
        if not self._done[position]:
            self._done[position] = 1
            self.settled += 1
            self._failed.append((position, error))

    def drain(self) -> tuple[list[int], list[Any]]:
        """The ids and outcomes filed since the last call (each id once, ever)."""
        ids, got, values = self.ids, [], []
        for position, vals in self._arrived:
            got += ids[position:position + len(vals)]
            values += vals
        for position, error in self._failed:
            got.append(ids[position])
            values.append(error)
        self._arrived, self._failed = [], []
        return got, values

    def missing(self) -> list[int]:
        """The ids with no outcome yet."""
        done = self._done
        return [i for p, i in enumerate(self.ids) if not done[p]]


def hand_over_parked(parked: list[tuple[int, list[Any]]], claim: "StreamClaim",
                     runs: list[tuple[int, int, int, int]]) -> list[tuple[int, list[Any]]]:
    """Give ``claim`` the results of its ``runs`` found in ``parked`` (``(first id, values)``
    runs of consecutive seqs of one queue) by slice; return what stays parked."""
    wanted: dict[int, list[tuple[int, int, int]]] = {}
    for q, first, count, pos0 in runs:
        wanted.setdefault(q, []).append((first, count, pos0))
    keep: list[tuple[int, list[Any]]] = []
    for first_id, values in parked:
        q, lo0 = split_id(first_id)
        spans = wanted.get(q)
        if spans is None:
            keep.append((first_id, values))
            continue
        pieces = [(lo0, values)]
        for first, count, pos0 in spans:
            rest = []
            for lo, vals in pieces:
                a, b = max(first, lo), min(first + count, lo + len(vals))
                if a >= b:
                    rest.append((lo, vals))
                    continue
                claim.succeed(pos0 + (a - first), vals[a - lo:b - lo])
                if a > lo:
                    rest.append((lo, vals[:a - lo]))
                if b < lo + len(vals):
                    rest.append((b, vals[b - lo:]))
            pieces = rest
        keep.extend((make_id(q, lo), vals) for lo, vals in pieces)
    return keep
