"""The durable store's errors: its directory or files cannot be used, or the disk refuses.

Raised (or, for :class:`CorruptRecordError`, reported) by :mod:`daskqueue.segment` and the
durable pool's file. Import them from :mod:`daskqueue.errors`, which lists every daskqueue
error; this group, under :class:`StoreError`, is the storage layer's alone, so it is defined
apart from the errors of callers, queues and tasks. Their ``__module__`` is
``daskqueue.errors`` (:func:`~daskqueue.error_root.public_module`).
"""

from __future__ import annotations

from daskqueue.error_root import DaskQueueError, public_module

__all__ = [
    "StoreError", "StoreLockedError", "ForeignDirectoryError", "CorruptStoreError",
    "CorruptPoolFileError", "FormatVersionError", "CorruptRecordError", "StoreFullError",
    "StoreIOError", "StorePermissionError",
]


@public_module
class StoreError(DaskQueueError):
    """A durable queue's directory or files cannot be used; nothing acknowledged was lost."""


@public_module
class StoreLockedError(StoreError):
    """Another queue actor holds this queue directory open (its ``LOCK`` is taken)."""


@public_module
class ForeignDirectoryError(StoreError):
    """The directory is not a daskqueue store: not empty and without the store's marker."""


@public_module
class CorruptStoreError(StoreError):
    """A store file is not what its name says (wrong magic, damaged header)."""


@public_module
class CorruptPoolFileError(CorruptStoreError):
    """A durable pool's ``daskqueue-pool.json`` cannot be read as a pool file (not JSON, or
    fields of the wrong kind); ``path`` and ``reason`` say which and why. The queues' own
    directories are untouched: repair or restore the file, then reopen the pool."""

    _fields = ("path", "reason")

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@public_module
class FormatVersionError(StoreError):
    """A store file was written by a newer format version than this code reads."""

    _fields = ("path", "version", "supported")

    def __init__(self, path: str, version: int, supported: int) -> None:
        super().__init__(f"{path}: format version {version} is newer than {supported}; upgrade daskqueue")
        self.path = path
        self.version = version
        self.supported = supported


@public_module
class CorruptRecordError(StoreError):
    """A record failed its checksum before the end of its file: it was skipped.

    Reported (not raised) during recovery through the store's ``on_corruption`` callback;
    ``path``, ``offset`` and ``bytes_dropped`` say exactly what was lost.
    """

    _fields = ("path", "offset", "reason", "bytes_dropped")

    def __init__(self, path: str, offset: int, reason: str, bytes_dropped: int) -> None:
        super().__init__(f"{path} at offset {offset}: {reason}; {bytes_dropped} bytes dropped")
        self.path = path
        self.offset = offset
        self.reason = reason
        self.bytes_dropped = bytes_dropped


@public_module
class StoreFullError(StoreError):
    """The disk (or quota) is full: the write was refused and rolled back; retry later."""


@public_module
class StoreIOError(StoreError):
    """The operating system failed a file operation of the store (``EIO`` from a read, write,
    ``fsync`` or ``msync``, ...). ``path``, ``operation`` and ``errno`` say which; the
    ``OSError`` is the ``__cause__``.

    After a failed write-back (``fsync``/``msync``) the kernel may have dropped the unwritten
    pages, so the store refuses every later write with this error: reopen the queue, and
    recovery reads what really is on disk. Writes acknowledged before the failure were in the
    page cache, so a process that keeps running loses none of them.
    """

    _fields = ("path", "operation", "errno", "detail")

    def __init__(self, path: str, operation: str, errno: int | None, detail: str) -> None:
        super().__init__(f"{path}: {operation} failed: {detail}")
        self.path = path
        self.operation = operation
        self.errno = errno
        self.detail = detail


@public_module
class StorePermissionError(StoreIOError):
    """The store's directory or one of its files may not be read or written (``EACCES``,
    ``EPERM``, ``EROFS``); nothing was modified by the refused operation."""
