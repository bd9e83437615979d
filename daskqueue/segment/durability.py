"""A store's durability bookkeeping and its sync thread (FORMAT.md, "Durability settings").

:class:`Durability` knows when a sync is due under the ``fsync`` policy, runs sync jobs one
at a time on one thread of their own (so a slow disk, NFS or Lustre, stalls that thread and
not the owner's event loop), and latches the first failed write-back: after it the store
refuses every write, since the kernel may have dropped the pages it could not write and only
a reopen knows what is on disk.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Literal, TypeVar

from daskqueue.errors import StoreError, StoreIOError
from daskqueue.segment.log import os_errors

__all__ = ["Durability", "FsyncPolicy"]

logger = logging.getLogger("daskqueue")

FsyncPolicy = Literal["always", "interval", "never"]

T = TypeVar("T")


class Durability:
    """The sync state of the store in ``dirpath``.

    The owner's thread marks writes (``mark_dirty``) and starts syncs (``submit``); the jobs
    run on the sync thread, created with the first ``submit``. ``write_back`` and the latch
    may be used from either thread.
    """

    def __init__(self, dirpath: str, fsync: FsyncPolicy, interval_s: float) -> None:
        if fsync not in ("always", "interval", "never"):
            raise ValueError(f"fsync must be 'always', 'interval' or 'never', got {fsync!r}")
        self.dirpath = dirpath
        self.fsync = fsync
        self.interval_s = interval_s
        self._dirty_since: float | None = None
        self._sync_scheduled = False  # commit() told the owner of the pending interval sync
        self._failed: StoreError | None = None  # a failed write-back or roll-back: stop writing
        self._executor: ThreadPoolExecutor | None = None

    # -- what is due ----------------------------------------------------------------------------

    def mark_dirty(self) -> None:
        if self._dirty_since is None:
            self._dirty_since = time.monotonic()

    @property
    def unsynced(self) -> bool:
        """Whether something was written since the last sync began."""
        return self._dirty_since is not None

    def commit(self) -> bool:
        """True when an ``interval`` sync became due that the owner has not been told about
        since the last sync (whoever ran it): the owner must then schedule one."""
        if self.fsync == "interval" and self._dirty_since is not None and not self._sync_scheduled:
            self._sync_scheduled = True
            return True
        return False

    def due_in(self) -> float | None:
        """Seconds until an ``interval`` sync is due (0: now), or None if none is pending."""
        if self._dirty_since is None or self.fsync != "interval" or self._failed is not None:
            return None
        return max(0.0, self._dirty_since + self.interval_s - time.monotonic())

    def begin(self) -> None:
        """A sync of everything written so far is starting: nothing is pending any more."""
        self._dirty_since = None
        self._sync_scheduled = False

    # -- the sync thread ------------------------------------------------------------------------

    def submit(self, job: Callable[[], T]) -> Future[T]:
        """Run ``job`` on the sync thread, after every job submitted before it."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="daskqueue-sync")
        return self._executor.submit(job)

    def run(self, job: Callable[[], T]) -> T:
        """Run ``job`` after every job submitted before it and return its result (blocks the
        caller; before the first ``submit``, runs it right here)."""
        if self._executor is None:
            return job()
        return self._executor.submit(job).result()

    def wait(self) -> None:
        """Return once every job submitted has ended (blocks the caller)."""
        if self._executor is not None:
            self._executor.submit(lambda: None).result()

    def shutdown(self) -> None:
        """Wait for the jobs submitted (a failed one: those before it end first); end the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # -- failure --------------------------------------------------------------------------------

    def write_back(self, sync: Callable[[], None]) -> None:
        """Run one msync/fsync; if it fails, no later write is accepted."""
        self.check_usable()
        try:
            with os_errors(self.dirpath, "fsync"):  # fsync_dir's errors; the rest wrap their own
                sync()
        except StoreError as e:
            self.fail(e)
            raise

    @property
    def failed(self) -> bool:
        return self._failed is not None

    def fail(self, error: StoreError) -> None:
        logger.error("%s: %s; refusing further writes until the queue is reopened", self.dirpath, error)
        self._failed = error

    def check_usable(self) -> None:
        """Raise :class:`StoreIOError` if a write-back failed before."""
        if self._failed is not None:
            raise StoreIOError(
                self.dirpath, "write", getattr(self._failed, "errno", None),
                f"refused after an earlier failure ({self._failed}); reopen the queue",
            ) from self._failed
