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

from daskqueue.errors import ConfigurationError, ForeignDirectoryError

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
    """
    if os.path.exists(dirpath) and not os.path.isdir(dirpath):
        raise ConfigurationError(f"dirpath {dirpath} exists and is not a directory")
    if not os.path.exists(dirpath):  # a new directory is the owner's only (unless ``mode`` says)
        os.makedirs(dirpath, mode=mode, exist_ok=True)
        os.chmod(dirpath, mode)
    meta = os.path.join(dirpath, POOL_FILE)
    removed: list[int] = []
    if os.path.exists(meta):
        removed = _check_known_shape(dirpath, meta, n_queues)
    elif os.listdir(dirpath):
        raise ForeignDirectoryError(f"{dirpath} is not empty and is not a daskqueue pool directory")
    _write_shape(meta, n_queues, removed)
    return [queue_dir(dirpath, i) for i in range(n_queues)]


def removed_queues(dirpath: str) -> set[int]:
    """The queues of the pool at ``dirpath`` that ``remove_queue`` took out."""
    meta = os.path.join(dirpath, POOL_FILE)
    if not os.path.exists(meta):
        return set()
    with open(meta) as f:
        return set(json.load(f).get("removed", []))


def record_removed(dirpath: str, index: int) -> None:
    """Record that queue ``index`` of the pool at ``dirpath`` was drained and taken out."""
    meta = os.path.join(dirpath, POOL_FILE)
    with open(meta) as f:
        known = json.load(f)
    _write_shape(meta, known["n_queues"], sorted(set(known.get("removed", [])) | {index}))


def _check_known_shape(dirpath: str, meta: str, n_queues: int) -> list[int]:
    with open(meta) as f:
        known = json.load(f)
    if known.get("format") != POOL_FORMAT:
        raise ConfigurationError(f"{meta} has an unknown format {known.get('format')!r}")
    if n_queues < known["n_queues"]:
        raise ConfigurationError(
            f"{dirpath} holds {known['n_queues']} queues; reopen it with n_queues >= "
            f"{known['n_queues']} so that none of their messages is orphaned"
        )
    return list(known.get("removed", []))


def _write_shape(meta: str, n_queues: int, removed: list[int] = ()) -> None:  # type: ignore[assignment]
    tmp = meta + ".tmp"
    shape: dict[str, object] = {"format": POOL_FORMAT, "n_queues": n_queues}
    if removed:
        shape["removed"] = list(removed)
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
