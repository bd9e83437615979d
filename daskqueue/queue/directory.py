"""The directory of a durable pool: one sub-directory per queue, and a file that records the
pool's shape so that a reopen cannot orphan a queue.

``<dirpath>/daskqueue-pool.json`` holds ``{"format": 1, "n_queues": N, "removed": [...]}``
(``removed``: queues that ``QueuePool.remove_queue`` drained and took out; their indices are
not reused); queue ``i`` lives in ``<dirpath>/queue-<iii>`` (a segment store,
``daskqueue/segment/FORMAT.md``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from daskqueue.errors import ConfigurationError, CorruptPoolFileError, ForeignDirectoryError
from daskqueue.segment.log import os_errors

__all__ = ["POOL_FILE", "POOL_FORMAT", "prepare_pool_dir", "queue_dir", "removed_queues", "record_removed"]

#: The file that marks a directory as a pool's and records how many queues it holds.
POOL_FILE = "daskqueue-pool.json"
POOL_FORMAT = 1


def queue_dir(dirpath: str, index: int) -> str:
    """The directory of queue ``index`` of the pool at ``dirpath``."""
    return os.path.join(dirpath, f"queue-{index:03d}")


def prepare_pool_dir(dirpath: str, n_queues: int, mode: int = 0o700) -> list[str]:
    """Create or check the pool directory ``dirpath`` for ``n_queues`` queues; return the queue
    directories, in queue order.

    Raises :class:`ConfigurationError` if ``dirpath`` is a file, its pool file has an unknown
    format, or it holds more queues than ``n_queues`` (their messages would be orphaned), and
    :class:`ForeignDirectoryError` if it is a non-empty directory that is not a pool's. The
    pool file is replaced atomically (written, fsynced, renamed, directory fsynced).

    Every function here raises the operating system's refusals as :class:`StoreError` leaves
    naming the path (:class:`StorePermissionError`, :class:`StoreFullError`,
    :class:`StoreIOError`) and an unreadable pool file as :class:`CorruptPoolFileError`.
    """
    if os.path.exists(dirpath) and not os.path.isdir(dirpath):
        raise ConfigurationError(f"dirpath {dirpath} exists and is not a directory")
    if not os.path.exists(dirpath):  # a new directory is the owner's only (unless ``mode`` says)
        with os_errors(dirpath, "create the pool directory"):
            os.makedirs(dirpath, mode=mode, exist_ok=True)
            os.chmod(dirpath, mode)
    meta = os.path.join(dirpath, POOL_FILE)
    removed: list[int] = []
    if os.path.exists(meta):
        removed = _check_known_shape(dirpath, meta, n_queues)
    else:
        with os_errors(dirpath, "list the pool directory"):
            foreign = bool(os.listdir(dirpath))
        if foreign:
            raise ForeignDirectoryError(f"{dirpath} is not empty and is not a daskqueue pool directory")
    _write_shape(meta, n_queues, removed)
    return [queue_dir(dirpath, i) for i in range(n_queues)]


def removed_queues(dirpath: str) -> set[int]:
    """The queues of the pool at ``dirpath`` that ``remove_queue`` took out."""
    meta = os.path.join(dirpath, POOL_FILE)
    if not os.path.exists(meta):
        return set()
    return set(_read_shape(meta)["removed"])


def record_removed(dirpath: str, index: int) -> None:
    """Record that queue ``index`` of the pool at ``dirpath`` was drained and taken out."""
    meta = os.path.join(dirpath, POOL_FILE)
    known = _read_shape(meta)
    _write_shape(meta, known["n_queues"], sorted(set(known["removed"]) | {index}))


def _read_shape(meta: str) -> dict[str, Any]:
    """The pool file at ``meta``: ``{"format", "n_queues", "removed"}`` (``removed`` filled
    in), checked for its format and field types."""
    with os_errors(meta, "read the pool file"):
        with open(meta, "rb") as f:
            raw = f.read()
    try:
        known = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        raise CorruptPoolFileError(meta, f"not JSON ({e})") from e
    if not isinstance(known, dict):
        raise CorruptPoolFileError(meta, f"holds {type(known).__name__}, not an object")
    if known.get("format") != POOL_FORMAT:
        raise ConfigurationError(f"{meta} has an unknown format {known.get('format')!r}")
    n_queues, removed = known.get("n_queues"), known.setdefault("removed", [])
    if not isinstance(n_queues, int) or isinstance(n_queues, bool) or n_queues < 0:
        raise CorruptPoolFileError(meta, f"n_queues is {n_queues!r}, not a count")
    if not isinstance(removed, list) or not all(isinstance(i, int) for i in removed):
        raise CorruptPoolFileError(meta, f"removed is {removed!r:.80}, not a list of queue indices")
    return known


def _check_known_shape(dirpath: str, meta: str, n_queues: int) -> list[int]:
    known = _read_shape(meta)
    if n_queues < known["n_queues"]:
        raise ConfigurationError(
            f"{dirpath} holds {known['n_queues']} queues; reopen it with n_queues >= "
            f"{known['n_queues']} so that none of their messages is orphaned"
        )
    return list(known["removed"])


def _write_shape(meta: str, n_queues: int, removed: list[int] = ()) -> None:  # type: ignore[assignment]
    tmp = meta + ".tmp"
    shape: dict[str, object] = {"format": POOL_FORMAT, "n_queues": n_queues}
    if removed:
        shape["removed"] = list(removed)
    with os_errors(meta, "write the pool file"):
        with open(tmp, "w") as f:
            json.dump(shape, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, meta)
        # The rename is durable only once the directory entry is on disk.
        fd = os.open(os.path.dirname(meta), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
