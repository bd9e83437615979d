"""The order in which outcomes were filed, so that a taker of a set of ids looks only at new ones.

``as_completed(ids)`` takes its outcomes a poll's worth at a time from the collector's
dicts, which also hold outcomes other callers will take (the next chunk's, with two chunks
in flight). Scanning the wanted ids (or the dicts) on every poll made a chunk of 100,000
ids cost time quadratic in its size; an :class:`Arrivals` log lets each taker keep a cursor
and scan only the ids filed since it last looked. Pure: no Dask, no clock, no I/O, and
not thread-safe (the collector calls it under its lock).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

__all__ = ["Arrivals", "Cursor"]

#: ``(epoch, position)``: where a taker stopped reading. A cursor of an older epoch (the log
#: was cleared or compacted since) tells the taker to scan everything once.
Cursor = tuple[int, int]

#: The log is compacted once it is this much longer than twice the outcomes still held.
_SLACK = 100_000


class Arrivals:
    """Ids in the order their outcomes were filed (an id may repeat; a taken one stays in
    the log until the next compaction: readers check that the outcome is still held).

    The log keeps what it was given (a ``range`` of a parked run of results stays a range)
    and lists the ids only when a taker asks (:meth:`since`): most outcomes are taken
    without the log (claimed, or ``results(clear=True)``), and a million ids written out
    cost ``join`` + ``results`` a tenth of their client time for nobody to read them."""

    def __init__(self) -> None:
        self._parts: list[Sequence[int]] = []
        self._count = 0
        self._epoch = 0

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"Arrivals({self._count:,} ids, epoch {self._epoch})"

    def add(self, ids: Iterable[int]) -> None:
        part = ids if isinstance(ids, (range, tuple)) else list(ids)
        if part:
            self._parts.append(part)
            self._count += len(part)

    def end(self) -> Cursor:
        """A cursor past everything filed so far."""
        return self._epoch, len(self._parts)

    def since(self, cursor: Cursor | None) -> list[int] | None:
        """The ids filed after ``cursor``; None if the caller must scan every held outcome
        (no cursor yet, or the log was cleared or compacted since)."""
        if cursor is None or cursor[0] != self._epoch:
            return None
        out: list[int] = []
        for part in self._parts[cursor[1]:]:
            out += part
        return out

    def clear(self) -> None:
        """Every held outcome was taken at once: forget the log."""
        self._parts, self._count = [], 0
        self._epoch += 1

    def compact(self, held: Callable[[], list[int]], n_held: int) -> None:
        """Once the log outgrew the ``n_held`` outcomes still held, replace it by ``held()``
        (their ids; their order no longer matters: every cursor is then out of date)."""
        if self._count > 2 * n_held + _SLACK:
            ids = held()
            self._parts, self._count = ([ids] if ids else []), len(ids)
            self._epoch += 1
