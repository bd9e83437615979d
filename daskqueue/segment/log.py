"""``LogSegment``: an append-only, memory-mapped, sparsely preallocated file of log records.

Not thread-safe; owned by one ``SegmentStore``. See FORMAT.md, "Log segment".
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from daskqueue.errors import (
    CorruptRecordError,
    CorruptStoreError,
    FormatVersionError,
    StoreError,
    StoreFullError,
    StoreIOError,
    StorePermissionError,
)
from daskqueue.segment.format import (
    CRC,
    FILE_HEADER,
    FILE_HEADER_FIELDS,
    FORMAT_VERSION,
    LOG_MAGIC,
    LOG_RECORD_FIELDS,
    LOG_RECORD_HEADER,
    LogType,
    checksum,
    pack_file_header,
)

__all__ = ["LogSegment", "check_header", "header_is_blank", "os_errors", "store_error", "unlink_if_there"]

_PAGE = mmap.ALLOCATIONGRANULARITY
#: On Linux, msync(MS_SYNC) of a shared file mapping is an fdatasync of its range
#: (mm/msync.c calls vfs_fsync_range with datasync=1): the same pages reach the disk. But
#: ``os.fdatasync`` releases the GIL while it waits and ``mmap.flush`` does not, and a sync
#: runs on the store's sync thread so that a slow disk stalls that thread, not the loop.
_MSYNC_IS_FDATASYNC = sys.platform.startswith("linux")


_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def store_error(e: OSError, path: str, operation: str) -> StoreError:
    """The :class:`StoreError` leaf for an ``OSError`` of ``operation`` on ``path``."""
    if e.errno in _FULL:
        return StoreFullError(f"{path}: no space left to {operation}")
    cls = StorePermissionError if e.errno in _DENIED else StoreIOError
    return cls(path, operation, e.errno, e.strerror or str(e))


@contextmanager
def os_errors(path: str, operation: str) -> Iterator[None]:
    """Raise an ``OSError`` from inside as its :class:`StoreError` leaf, ``from`` it."""
    try:
        yield
    except OSError as e:
        raise store_error(e, path, operation) from e


def check_header(path: str, head: bytes, magic: bytes) -> None:
    """Apply recovery rule 2 to a file header: wrong magic or newer version is refused."""
    if len(head) < FILE_HEADER.size:
        raise CorruptStoreError(f"{path}: file shorter than its {FILE_HEADER.size}-byte header")
    got_magic, version, _, crc = FILE_HEADER.unpack(head[: FILE_HEADER.size])
    if got_magic != magic:
        raise CorruptStoreError(f"{path}: wrong magic {got_magic!r}, expected {magic!r}")
    if crc != checksum(head[: FILE_HEADER_FIELDS.size]):
        raise CorruptStoreError(f"{path}: header checksum mismatch")
    if version > FORMAT_VERSION:
        raise FormatVersionError(path, version, FORMAT_VERSION)


def header_is_blank(path: str) -> bool:
    """True if ``path`` is shorter than a file header or its header is all zeros: what a crash
    between creating a segment and its header reaching the disk leaves (recovery rule 2)."""
    with os_errors(path, "read the header"):
        fd = os.open(path, os.O_RDONLY)
        try:
            head = os.pread(fd, FILE_HEADER.size, 0)
        finally:
            os.close(fd)
    return len(head) < FILE_HEADER.size or not any(head)


class LogSegment:
    """One log segment file of fixed capacity; records are appended at ``end``."""

    def __init__(self, path: str, number: int, fd: int, capacity: int, end: int) -> None:
        self.path = path
        self.number = number
        self._fd = fd
        self.capacity = capacity
        self.end = end
        self._synced = end
        self._map = mmap.mmap(fd, capacity)

    @classmethod
    def create(cls, path: str, number: int, capacity: int, mode: int = 0o600) -> LogSegment:
        """Create a sparse segment of ``capacity`` bytes holding only its header.

        Crash-safe: the file is written and fsynced as ``path + ".tmp"`` and only then renamed
        to ``path``, so ``path`` never exists without its header (recovery rule 1 deletes a
        ``.tmp`` a crash left). The caller fsyncs the directory to make the name durable.
        """
        if os.path.exists(path):
            raise StoreError(f"{path}: log segment exists already")
        tmp = path + ".tmp"
        with os_errors(tmp, "create a log segment"):
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
        try:
            with os_errors(tmp, "create a log segment"):
                os.ftruncate(fd, capacity)  # sparse: no blocks, no zero buffer
                head = pack_file_header(LOG_MAGIC)
                _reserve(fd, 0, len(head), tmp)
                os.pwrite(fd, head, 0)
                os.fsync(fd)
                os.replace(tmp, path)
                return cls(path, number, fd, capacity, len(head))
        except BaseException:
            os.close(fd)
            unlink_if_there(tmp)
            raise

    @classmethod
    def open(cls, path: str, number: int) -> LogSegment:
        """Open an existing segment; the store sets ``end`` from the index (recovery rule 9)."""
        with os_errors(path, "open a log segment"):
            fd = os.open(path, os.O_RDWR)
        try:
            with os_errors(path, "open a log segment"):
                check_header(path, os.pread(fd, FILE_HEADER.size, 0), LOG_MAGIC)
                return cls(path, number, fd, os.fstat(fd).st_size, FILE_HEADER.size)
        except BaseException:
            os.close(fd)
            raise

    def __repr__(self) -> str:
        return f"<LogSegment {self.number}: {self.end:,}/{self.capacity:,} bytes>"

    def fits(self, body_size: int) -> bool:
        return self.end + LOG_RECORD_HEADER.size + body_size <= self.capacity

    def append(self, kind: LogType, *parts: bytes | memoryview) -> int:
        """Append one record whose body is ``parts`` concatenated; return its offset.

        Blocks are reserved with ``posix_fallocate`` first, so a full disk raises
        :class:`StoreFullError` and leaves ``end`` unchanged.
        """
        length = sum(len(p) for p in parts)
        if not self.fits(length):
            raise StoreError(f"record of {length} bytes does not fit in {self!r}")
        at = self.end
        total = LOG_RECORD_HEADER.size + length
        _reserve(self._fd, at, total, self.path)
        head_rest = LOG_RECORD_FIELDS.pack(length, kind)
        crc = checksum(head_rest)
        m = self._map
        pos = at + LOG_RECORD_HEADER.size
        for part in parts:
            crc = checksum(part, crc)
            m[pos : pos + len(part)] = part
            pos += len(part)
        m[at : at + LOG_RECORD_HEADER.size] = CRC.pack(crc) + head_rest
        self.end = at + total
        return at

    def read(self, offset: int) -> tuple[LogType, bytes]:
        """The record at ``offset``: its type and body. Raises :class:`CorruptRecordError`."""
        m = self._map
        if offset < FILE_HEADER.size or offset + LOG_RECORD_HEADER.size > self.capacity:
            raise CorruptRecordError(self.path, offset, "record pointer outside the segment", 0)
        crc, length, kind = LOG_RECORD_HEADER.unpack_from(m, offset)
        end = offset + LOG_RECORD_HEADER.size + length
        if end > self.capacity:
            raise CorruptRecordError(self.path, offset, f"record length {length} runs past the segment", 0)
        if crc != checksum(m[offset + CRC.size : end]):
            raise CorruptRecordError(self.path, offset, "log record checksum mismatch", end - offset)
        try:
            record_type = LogType(kind)
        except ValueError:
            raise CorruptRecordError(self.path, offset, f"unknown log record type {kind}", end - offset) from None
        return record_type, m[offset + LOG_RECORD_HEADER.size : end]

    def record_end(self, offset: int) -> int:
        """Where the record at ``offset`` ends (from its length field)."""
        _, length, _ = LOG_RECORD_HEADER.unpack_from(self._map, offset)
        return offset + LOG_RECORD_HEADER.size + length

    def sync(self) -> None:
        """``msync`` the bytes appended since the last sync.

        May run on a sync thread while the owner appends: it covers the bytes appended
        before it read ``end``; later ones wait for the next sync."""
        end = self.end
        if end > self._synced:
            start = self._synced - self._synced % _PAGE
            with os_errors(self.path, "msync"):
                if _MSYNC_IS_FDATASYNC:
                    os.fdatasync(self._fd)
                else:
                    self._map.flush(start, end - start)
            self._synced = end

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None  # type: ignore[assignment]
            os.close(self._fd)


def unlink_if_there(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _reserve(fd: int, offset: int, length: int, path: str) -> None:
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # file systems without fallocate
            raise store_error(e, path, f"reserve {length} bytes") from e
