"""Opening a store directory's files: recovery rules 1, 2 and 9 of FORMAT.md, and rules 3-5
through ``read_index``.

Rules 1-5 only decide: every header is checked and the index replayed before any file is
deleted or truncated, so an open that is refused leaves the directory as it was.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from daskqueue.errors import CorruptRecordError, CorruptStoreError
from daskqueue.segment.format import FILE_HEADER, LOG_RECORD_HEADER, IndexRecord, index_name, log_name
from daskqueue.segment.index import Dropped, IndexSegment, Replayed, read_index
from daskqueue.segment.lockfile import fsync_dir, numbered
from daskqueue.segment.log import LogSegment, header_is_blank, os_errors

__all__ = ["OpenedFiles", "append_point", "open_files"]

logger = logging.getLogger("daskqueue")


@dataclass
class OpenedFiles:
    """What opening found: the log segments by number (the highest is the active one; the
    caller sets its ``end`` by rule 9, ``append_point``), the newest index and its
    generation, its replayed records, the corrupt records rule 5 skipped and the torn tail
    or zero fill rules 3-4 dropped."""

    segments: dict[int, LogSegment] = field(default_factory=dict)
    index: IndexSegment | None = None
    generation: int = 1
    records: list[IndexRecord] = field(default_factory=list)
    corruptions: list[CorruptRecordError] = field(default_factory=list)
    tail: Dropped | None = None

    def close(self) -> None:
        for segment in self.segments.values():
            segment.close()
        if self.index is not None:
            self.index.close()


def open_files(dirpath: str, file_mode: int) -> OpenedFiles:
    """Apply rules 1-5 and 9 to the files in ``dirpath`` (marker checked, lock held).

    A new store gets index generation 1 and no segment (the caller makes segment 1). On an
    error every file opened so far is closed again.
    """
    opened = OpenedFiles()
    try:
        _open(dirpath, file_mode, opened)
    except BaseException:
        opened.close()
        raise
    return opened


def _open(dirpath: str, file_mode: int, opened: OpenedFiles) -> None:
    def path(name: str) -> str:
        return os.path.join(dirpath, name)

    with os_errors(dirpath, "list the queue directory"):
        names = os.listdir(dirpath)
    doomed = sorted(n for n in names if n.endswith(".tmp"))  # rule 1
    generations = numbered(names, ".index")
    doomed += [index_name(g) for g in generations[:-1]]  # rule 1: older generations
    numbers = numbered(names, ".log")
    if generations == [1] and not numbers and header_is_blank(path(index_name(1))):
        doomed.append(index_name(1))  # rule 2: a new store's first index, cut short
        generations = []
    if numbers and not generations:  # rule 1: logs without the index that explains them
        raise CorruptStoreError(
            f"{dirpath}: log segments {numbers} but no index file; refusing to open it "
            "as an empty queue (that would overwrite them). Nothing was modified."
        )
    unfinished = _open_segments(dirpath, numbers, opened.segments)  # rule 2
    replayed = read_index(path(index_name(generations[-1]))) if generations else None
    if unfinished is not None:
        _check_unfinished(path(log_name(unfinished)), unfinished, replayed)  # rule 2
        doomed.append(log_name(unfinished))
    _remove(dirpath, doomed)
    if replayed is None:
        opened.index = IndexSegment.create(path(index_name(1)), mode=file_mode)
        with os_errors(dirpath, "fsync"):
            fsync_dir(dirpath)
        return
    opened.generation = generations[-1]
    opened.index = IndexSegment.open(path(index_name(opened.generation)), replayed.good_end)
    opened.records = replayed.records
    opened.corruptions = list(replayed.corruptions)
    opened.tail = replayed.tail


def _open_segments(dirpath: str, numbers: list[int], segments: dict[int, LogSegment]) -> int | None:
    """Open every segment by rule 2; return the newest's number if its header is blank
    (rule 2's exception: decided once the index is read), else None."""
    unfinished = None
    if numbers and header_is_blank(os.path.join(dirpath, log_name(numbers[-1]))):
        unfinished = numbers[-1]
    for number in numbers:
        if number != unfinished:
            segments[number] = LogSegment.open(os.path.join(dirpath, log_name(number)), number)
    return unfinished


def _check_unfinished(path: str, number: int, replayed: Replayed | None) -> None:
    """Rule 2: a blank-headed newest segment that an index record names is refused; one no
    record names never held an acknowledged record (a crash interrupted its creation)."""
    if replayed is not None and any(r.segment == number for r in replayed.records):
        raise CorruptStoreError(f"{path}: header is all zeros, yet the index names this segment")


def _remove(dirpath: str, names: list[str]) -> None:
    """Rules 1 and 2: delete what an interrupted compaction or file creation left."""
    for name in names:
        logger.info("%s: deleting %s, left by an interrupted compaction or file creation", dirpath, name)
        with os_errors(os.path.join(dirpath, name), "delete"):
            os.unlink(os.path.join(dirpath, name))
    if names:
        with os_errors(dirpath, "fsync"):
            fsync_dir(dirpath)


def append_point(segment: LogSegment, records: list[IndexRecord]) -> int:
    """Rule 9: after the furthest record of ``segment`` that the index references."""
    end = FILE_HEADER.size
    for r in records:
        if r.segment == segment.number and r.offset + LOG_RECORD_HEADER.size <= segment.capacity:
            end = max(end, segment.record_end(r.offset))
    return min(end, segment.capacity)
