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

__all__ = ["Dropped", "IndexSegment", "Replayed", "read_index"]

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
    def create(cls, path: str, records: list[bytes] = (), mode: int = 0o600) -> IndexSegment:  # type: ignore[assignment]
        """Create ``path`` with a header and ``records`` (encoded with ``IndexRecord.to_bytes()``:
        compaction keeps them so, see ``DurableQueue._compact``), crash-safely: written and fsynced as
        ``path + ".tmp"``, then renamed to ``path`` with ``os.replace``. The caller fsyncs the
        directory; recovery rule 1 deletes a ``.tmp`` a crash left."""
        tmp = path + ".tmp"
        with os_errors(tmp, "create an index"):
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, mode)
        try:
            data = pack_file_header(INDEX_MAGIC) + b"".join(records)
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
        """fsync the appends so far. May run on a sync thread while the owner appends: an
        append made meanwhile marks the index dirty again, for the next sync."""
        if self.dirty:
            self.dirty = False
            with os_errors(self.path, "fsync"):
                os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True, slots=True)
class Dropped:
    """Bytes recovery gave up: by which rule (3 torn write, 4 zero fill, 5 corruption), in
    which file, from which offset, how many, and why."""

    rule: int
    path: str
    offset: int
    bytes_dropped: int
    reason: str


@dataclass(eq=False)
class Replayed:
    """An index file read by rules 2-5: its records, where its good data ends, the records
    rule 5 skipped and the tail rules 3 and 4 drop. Reading it changed nothing on disk."""

    records: list[IndexRecord]
    good_end: int
    corruptions: list[CorruptRecordError]
    tail: Dropped | None


def read_index(path: str) -> Replayed:
    """Read and replay ``path`` by recovery rules 2-5, without modifying it."""
    with os_errors(path, "read the index"):
        with os.fdopen(os.open(path, os.O_RDONLY), "rb") as f:
            data = f.read()
    check_header(path, data, INDEX_MAGIC)
    corruptions: list[CorruptRecordError] = []
    records, good_end = _replay(path, data, corruptions.append)
    return Replayed(records, good_end, corruptions, _tail(path, data, good_end))


def _tail(path: str, data: bytes, good_end: int) -> Dropped | None:
    """Rules 3 and 4: what follows the last intact record, if anything."""
    size = len(data) - good_end
    if not size:
        return None
    rule, reason = (4, "zero fill") if data.count(0, good_end) == size else (3, "torn write")
    logger.info("%s: %s of %d bytes from offset %d dropped", path, reason, size, good_end)
    return Dropped(rule, path, good_end, size, reason)


def _replay(
    path: str, data: bytes, on_corruption: Callable[[CorruptRecordError], None]
) -> tuple[list[IndexRecord], int]:
    """Decode the records up to the last intact one; return them and where they end.

    Linear: one backward pass finds the tail (rules 3, 4), one forward pass decodes and
    reports each run of bad records before it once (rule 5).
    """
    size = INDEX_RECORD.size
    view = memoryview(data)
    good_end = _good_end(view)
    records: list[IndexRecord] = []
    bad_from, reasons = -1, []
    for at in range(FILE_HEADER.size, good_end, size):
        decoded = _decode(view[at : at + size])
        if isinstance(decoded, IndexRecord):
            if bad_from >= 0:  # rule 5: skip the run, go on
                on_corruption(CorruptRecordError(path, bad_from, "; ".join(reasons), at - bad_from))
                bad_from, reasons = -1, []
            records.append(decoded)
            continue
        if bad_from < 0:
            bad_from = at
        if decoded not in reasons:
            reasons.append(decoded)
    return records, good_end


def _good_end(view: memoryview) -> int:
    """Where the last intact record ends (the header's end if there is none)."""
    size = INDEX_RECORD.size
    for k in reversed(range((len(view) - FILE_HEADER.size) // size)):
        at = FILE_HEADER.size + k * size
        if isinstance(_decode(view[at : at + size]), IndexRecord):
            return at + size
    return FILE_HEADER.size


def _decode(buf: memoryview) -> IndexRecord | str:
    """The record in ``buf``, or why it is unusable."""
    if IndexRecord.is_intact(buf):
        try:
            return IndexRecord.from_bytes(buf)
        except ValueError:
            return "unknown index record type"
    return "zero-filled index record" if buf == _ZERO_RECORD else "index record checksum mismatch"


def _write_all(fd: int, data: bytes, path: str) -> None:
    view = memoryview(data)
    with os_errors(path, f"append {len(data)} bytes"):
        while view:
            n = os.write(fd, view)
            view = view[n:]
