"""The directory of a durable pool: one sub-directory per queue, and a file that records the
pool's shape so that a reopen cannot orphan a queue.

``<dirpath>/daskqueue-pool.json`` holds ``{"format": 1, "n_queues": N}``; queue ``i`` lives in
``<dirpath>/queue-<iii>`` (a segment store, ``daskqueue/segment/FORMAT.md``).
"""

from __future__ import annotations

import json
import os

from daskqueue.errors import ConfigurationError, ForeignDirectoryError

__all__ = ["POOL_FILE", "POOL_FORMAT", "prepare_pool_dir", "queue_dir"]

#: The file that marks a directory as a pool's and records how many queues it holds.
POOL_FILE = "daskqueue-pool.json"
POOL_FORMAT = 1


def queue_dir(dirpath: str, index: int) -> str:
    """The directory of queue ``index`` of the pool at ``dirpath``."""
    return os.path.join(dirpath, f"queue-{index:03d}")


def prepare_pool_dir(dirpath: str, n_queues: int) -> list[str]:
    """Create or check the pool directory ``dirpath`` for ``n_queues`` queues; return the queue
    directories, in queue order.

    Raises :class:`ConfigurationError` if ``dirpath`` is a file, its pool file has an unknown
    format, or it holds more queues than ``n_queues`` (their messages would be orphaned), and
    :class:`ForeignDirectoryError` if it is a non-empty directory that is not a pool's. The
    pool file is replaced atomically (written, fsynced, renamed, directory fsynced).
    """
    if os.path.exists(dirpath) and not os.path.isdir(dirpath):
        raise ConfigurationError(f"dirpath {dirpath} exists and is not a directory")
    os.makedirs(dirpath, exist_ok=True)
    meta = os.path.join(dirpath, POOL_FILE)
    if os.path.exists(meta):
        _check_known_shape(dirpath, meta, n_queues)
    elif os.listdir(dirpath):
        raise ForeignDirectoryError(f"{dirpath} is not empty and is not a daskqueue pool directory")
    _write_shape(meta, n_queues)
    return [queue_dir(dirpath, i) for i in range(n_queues)]


def _check_known_shape(dirpath: str, meta: str, n_queues: int) -> None:
    with open(meta) as f:
        known = json.load(f)
    if known.get("format") != POOL_FORMAT:
        raise ConfigurationError(f"{meta} has an unknown format {known.get('format')!r}")
    if n_queues < known["n_queues"]:
        raise ConfigurationError(
            f"{dirpath} holds {known['n_queues']} queues; reopen it with n_queues >= "
            f"{known['n_queues']} so that none of their messages is orphaned"
        )


def _write_shape(meta: str, n_queues: int) -> None:
    tmp = meta + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": POOL_FORMAT, "n_queues": n_queues}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, meta)
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(os.path.dirname(meta), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
