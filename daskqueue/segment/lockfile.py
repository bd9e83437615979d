"""A store directory's marker and lock, and the small file-system steps every part of the
store shares (FORMAT.md, "Files").

The marker (``DASKQUEUE``) tells a daskqueue store from a foreign directory; the lock
(``LOCK``, held with ``flock``) keeps a second queue actor out while one has it open.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time

from daskqueue.errors import ForeignDirectoryError, StoreError, StoreLockedError
from daskqueue.segment.format import LOCK_NAME, MARKER_NAME, MARKER_TEXT
from daskqueue.segment.log import os_errors, store_error

__all__ = ["DirectoryLock", "fsync_dir", "numbered", "prepare_directory", "unlink_or_warn"]

logger = logging.getLogger("daskqueue")


def prepare_directory(path: str, dir_mode: int) -> None:
    """Make ``path`` a store directory (created with ``dir_mode`` if missing), or check that
    it is one: a non-empty directory without the marker is refused
    (:class:`ForeignDirectoryError`)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise StoreError(f"{path} exists and is not a directory")
    with os_errors(path, "use as a queue directory"):
        if not os.path.exists(path):
            os.makedirs(path, mode=dir_mode, exist_ok=True)
            os.chmod(path, dir_mode)  # makedirs' mode is masked by the umask
        entries = set(os.listdir(path))
    if MARKER_NAME in entries:
        _check_marker(os.path.join(path, MARKER_NAME))
    elif entries - {LOCK_NAME, MARKER_NAME + ".tmp"}:
        raise ForeignDirectoryError(f"{path} is not empty and is not a daskqueue store (no {MARKER_NAME} file)")
    else:
        _write_marker(path)


def _check_marker(marker: str) -> None:
    with os_errors(marker, "read the store marker"):
        with open(marker, "rb") as f:
            text = f.read()
    if text != MARKER_TEXT:
        raise ForeignDirectoryError(f"{marker} is not a daskqueue store marker")


def _write_marker(dirpath: str) -> None:
    """Write the marker as ``.tmp``, fsynced, renamed: a crash leaves none or a whole one."""
    marker = os.path.join(dirpath, MARKER_NAME)
    with os_errors(marker, "write the store marker"):
        with open(marker + ".tmp", "wb") as f:
            f.write(MARKER_TEXT)
            f.flush()
            os.fsync(f.fileno())
        os.replace(marker + ".tmp", marker)
        fsync_dir(dirpath)


class DirectoryLock:
    """The ``LOCK`` of one store directory, held from construction to :meth:`release`.

    Taking it tries again for up to ``wait_s`` while another holder has it (an actor of a pool
    whose client just died closes within seconds), blocking the calling thread; then it
    raises :class:`StoreLockedError`.
    """

    def __init__(self, dirpath: str, file_mode: int, wait_s: float = 0.0) -> None:
        self.dirpath = dirpath
        path = os.path.join(dirpath, LOCK_NAME)
        with os_errors(path, "open the lock file"):
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, file_mode)
        try:
            _flock_waiting(self.fd, wait_s)
        except BlockingIOError:
            self._close()
            raise StoreLockedError(f"{dirpath} is open in another queue actor (its LOCK is held)") from None
        except OSError as e:
            self._close()
            raise store_error(e, path, "lock") from e

    @property
    def held(self) -> bool:
        return self.fd >= 0

    def release(self) -> None:
        """Unlock and close. Idempotent."""
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self._close()

    def drop(self) -> None:
        """Close without unlocking, as a dying process does (the kernel drops the flock with
        the last descriptor). For tests that simulate a crash."""
        self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _flock_waiting(fd: int, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def numbered(names: list[str], suffix: str) -> list[int]:
    """The numbers of the files named ``<number><suffix>``, ascending."""
    stems = (n[: -len(suffix)] for n in names if n.endswith(suffix))
    return sorted(int(stem) for stem in stems if stem.isdigit())


def unlink_or_warn(path: str) -> None:
    """Delete ``path``; if that fails, warn (the next open deletes what is left)."""
    try:
        os.unlink(path)
        logger.debug("deleted %s", path)
    except OSError as e:
        logger.warning("cannot delete %s (%s); the next open will", path, e)


def fsync_dir(path: str) -> None:
    """fsync a directory: the names created, renamed or deleted in it become durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
