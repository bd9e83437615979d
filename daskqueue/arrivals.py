"""The order in which outcomes were filed, so that a taker of a set of ids looks only at new ones.

``as_completed(ids)`` takes its outcomes a poll's worth at a time from the collector's
dicts, which also hold outcomes other callers will take (the next chunk's, with two chunks
in flight). Scanning the wanted ids (or the dicts) on every poll made a chunk of 100,000
ids cost time quadratic in its size; an :class:`Arrivals` log lets each taker keep a cursor
and scan only the ids filed since it last looked. Pure: no Dask, no clock, no I/O, and
not thread-safe (the collector calls it under its lock).
"""

from __future__ import annotations

from typing import Callable, Iterable

__all__ = ["Arrivals", "Cursor"]

#: ``(epoch, position)``: where a taker stopped reading. A cursor of an older epoch (the log
#: was cleared or compacted since) tells the taker to scan everything once.
Cursor = tuple[int, int]

#: The log is compacted once it is this much longer than twice the outcomes still held.
_SLACK = 100_000


class Arrivals:
    """Ids in the order their outcomes were filed (an id may repeat; a taken one stays in
    the log until the next compaction: readers check that the outcome is still held)."""

    def __init__(self) -> None:
        self._ids: list[int] = []
        self._epoch = 0

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return f"Arrivals({len(self._ids):,} ids, epoch {self._epoch})"

    def add(self, ids: Iterable[int]) -> None:
        self._ids.extend(ids)

    def end(self) -> Cursor:
        """A cursor past everything filed so far."""
        return self._epoch, len(self._ids)

    def since(self, cursor: Cursor | None) -> list[int] | None:
        """The ids filed after ``cursor``; None if the caller must scan every held outcome
        (no cursor yet, or the log was cleared or compacted since)."""
        if cursor is None or cursor[0] != self._epoch:
            return None
        return self._ids[cursor[1]:]

    def clear(self) -> None:
        """Every held outcome was taken at once: forget the log."""
        self._ids = []
        self._epoch += 1

    def compact(self, held: Callable[[], list[int]], n_held: int) -> None:
        """Once the log outgrew the ``n_held`` outcomes still held, replace it by ``held()``
        (their ids; their order no longer matters: every cursor is then out of date)."""
        if len(self._ids) > 2 * n_held + _SLACK:
            self._ids = held()
            self._epoch += 1
