"""Which log segments may be deleted: pins by live records, and rule 5's retention.

Pure bookkeeping, no I/O: the store asks :meth:`SegmentLifetimes.deletable` when it syncs
and deletes those segments itself, after the index fsync that settles their last records
(FORMAT.md, "Compaction and disk use").
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SegmentLifetimes"]


class SegmentLifetimes:
    """Pin counts per segment (one per live record in it), the segments whose count fell to
    zero since the last sync, and those kept whatever their pins until the next compaction
    (rule 5: corruption was reported)."""

    def __init__(self) -> None:
        self.pins: dict[int, int] = {}
        self._unpinned: set[int] = set()
        self._retained: set[int] = set()

    def pin(self, segment: int) -> None:
        """One more live record lives in ``segment``."""
        self.pins[segment] = self.pins.get(segment, 0) + 1
        self._unpinned.discard(segment)

    def unpin(self, segment: int) -> None:
        """A live record of ``segment`` died; with its last one, the segment is a candidate
        for deletion."""
        left = self.pins.get(segment, 0) - 1
        if left > 0:
            self.pins[segment] = left
            return
        self.pins.pop(segment, None)
        self._unpinned.add(segment)

    def reset(self, pinned: dict[int, int], segments: Iterable[int]) -> None:
        """Replace every pin count (after recovery or compaction); of ``segments``, those
        not pinned become candidates."""
        self.pins = dict(pinned)
        self._unpinned = set(segments) - set(pinned)

    def retain(self, segments: Iterable[int]) -> None:
        """Rule 5: keep ``segments`` until the next compaction, pinned or not."""
        self._retained.update(segments)

    def release_retained(self) -> None:
        """A compaction wrote an index without the damaged records: rule 5 no longer holds."""
        self._retained.clear()

    def deletable(self, active: int) -> list[int]:
        """Segments holding no live record, other than ``active`` and those rule 5 keeps."""
        return sorted(
            n for n in self._unpinned if n != active and not self.pins.get(n) and n not in self._retained
        )

    def forget_unpinned(self, active: int) -> None:
        """The candidates were dealt with (deleted, or retained). An ``active`` segment
        emptied while active stays a candidate for when a rollover retires it; retained
        ones come back with the pins compaction resets."""
        keep = active in self._unpinned and not self.pins.get(active)
        self._unpinned = {active} if keep else set()
