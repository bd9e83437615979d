"""``IndexSegment``: the write-ahead log of state transitions, fixed 40-byte records.

Not thread-safe; owned by one ``SegmentStore``. See FORMAT.md, "Index" and the recovery rules.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

from daskqueue.errors import CorruptRecordError
from daskqueue.segment.format import FILE_HEADER, INDEX_MAGIC, INDEX_RECORD, IndexRecord, pack_file_header
from daskqueue.segment.log import check_header, os_errors, unlink_if_there

__all__ = ["IndexSegment", "Replayed", "read_index"]

logger = logging.getLogger("daskqueue")

_ZERO_RECORD = bytes(INDEX_RECORD.size)


class IndexSegment:
    """An index file open for appending. ``size`` is its length in bytes."""

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path = path
        self._fd = fd
        self.size = size
        self.dirty = False

    @classmethod
    def create(cls, path: str, records: list[IndexRecord] = ()) -> IndexSegment:  # type: ignore[assignment]
        """Create ``path`` with a header and ``records``, crash-safely: written and fsynced as
        ``path + ".tmp"``, then renamed to ``path`` with ``os.replace``. The caller fsyncs the
        directory; recovery rule 1 deletes a ``.tmp`` a crash left."""
        tmp = path + ".tmp"
        with os_errors(tmp, "create an index"):
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            data = pack_file_header(INDEX_MAGIC) + b"".join(r.to_bytes() for r in records)
            _write_all(fd, data, tmp)
            with os_errors(tmp, "create an index"):
                os.fsync(fd)
                os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            unlink_if_there(tmp)
            raise
        return cls(path, fd, len(data))

    @classmethod
    def open(cls, path: str, good_end: int) -> IndexSegment:
        """Open ``path`` for appending at ``good_end`` (from :func:`read_index`); a torn tail or
        zero fill after it (rules 3, 4) is truncated away for good."""
        with os_errors(path, "open the index"):
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
        try:
            with os_errors(path, "truncate the index's torn tail"):
                if os.fstat(fd).st_size > good_end:
                    os.ftruncate(fd, good_end)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, good_end)

    def append(self, records: list[IndexRecord]) -> None:
        """Append ``records`` in one ``write`` (group commit); roll back on error.

        A refused write (:class:`StoreFullError`, ...) leaves the file as it was; if even the
        roll-back fails, :class:`StoreIOError` says so and the owner must stop writing.
        """
        if not records:
            return
        data = b"".join(r.to_bytes() for r in records)
        try:
            _write_all(self._fd, data, self.path)
        except BaseException:
            with os_errors(self.path, "roll back a failed append"):
                os.ftruncate(self._fd, self.size)  # no half record may stay behind
            raise
        self.size += len(data)
        self.dirty = True

    def sync(self) -> None:
        if self.dirty:
            with os_errors(self.path, "fsync"):
                os.fsync(self._fd)
            self.dirty = False

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(eq=False)
class Replayed:
    """An index file read by rules 2-5: its records, where its good data ends, and the
    records rule 5 skipped. Reading it changed nothing on disk."""

    records: list[IndexRecord]
    good_end: int
    corruptions: list[CorruptRecordError]


def read_index(path: str) -> Replayed:
    """Read and replay ``path`` by recovery rules 2-5, without modifying it."""
    with os_errors(path, "read the index"):
        with os.fdopen(os.open(path, os.O_RDONLY), "rb") as f:
            data = f.read()
    check_header(path, data, INDEX_MAGIC)
    corruptions: list[CorruptRecordError] = []
    records, good_end = _replay(path, data, corruptions.append)
    return Replayed(records, good_end, corruptions)


def _replay(
    path: str, data: bytes, on_corruption: Callable[[CorruptRecordError], None]
) -> tuple[list[IndexRecord], int]:
    size = INDEX_RECORD.size
    start = FILE_HEADER.size
    whole = (len(data) - start) // size
    view = memoryview(data)
    records: list[IndexRecord] = []
    good_end = start
    for k in range(whole):
        at = start + k * size
        buf = view[at : at + size]
        if buf == _ZERO_RECORD:
            reason = "zero-filled index record"
        elif IndexRecord.is_intact(buf):
            try:
                records.append(IndexRecord.from_bytes(buf))
                good_end = at + size
                continue
            except ValueError:
                reason = "unknown index record type"
        else:
            reason = "index record checksum mismatch"
        if not _intact_after(view, k + 1, whole, start):  # rules 3 and 4: the tail
            logger.info("%s: torn write or zero fill from offset %d dropped", path, at)
            return records, good_end
        on_corruption(CorruptRecordError(path, at, reason, size))  # rule 5: skip, go on
        good_end = at + size
    tail = len(data) - (start + whole * size)
    if tail:  # rule 3: a partial record at the tail
        logger.info("%s: partial record of %d bytes at the tail dropped", path, tail)
    return records, good_end


def _intact_after(view: memoryview, first: int, whole: int, start: int) -> bool:
    """True if any whole record from number ``first`` on passes its checksum."""
    size = INDEX_RECORD.size
    for k in range(first, whole):
        buf = view[start + k * size : start + (k + 1) * size]
        if buf != _ZERO_RECORD and IndexRecord.is_intact(buf):
            return True
    return False


def _write_all(fd: int, data: bytes, path: str) -> None:
    view = memoryview(data)
    with os_errors(path, f"append {len(data)} bytes"):
        while view:
            n = os.write(fd, view)
            view = view[n:]
