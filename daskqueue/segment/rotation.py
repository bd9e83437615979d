"""Log segment rotation: the next segment is made ahead of the rollover, off the owner's loop.

Making a segment fsyncs its file and then the directory (FORMAT.md, "Log segment"): on NFS or
Lustre, seconds. :class:`NextSegment` makes segment *n+1* on the store's sync thread as soon
as segment *n* becomes the active one (at open: right there, the open blocks anyway), so the
rollover itself only takes a segment that is already durable: its header, its name and the
directory entry are on disk before any record goes into it. Only when a whole segment
filled before the sync thread got to it (one put bigger than a segment, or a disk stalled
that long) does the rollover wait for it.

A spare holds no record. One left by a crash is the highest-numbered segment and becomes the
active one at the next open (rule 9); ``discard`` deletes it at a clean close.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future

from daskqueue.errors import StoreError
from daskqueue.segment.durability import Durability
from daskqueue.segment.format import log_name
from daskqueue.segment.lockfile import fsync_dir, unlink_or_warn
from daskqueue.segment.log import LogSegment

__all__ = ["NextSegment"]

logger = logging.getLogger("daskqueue")


class NextSegment:
    """The segment to roll over to, for the store in ``dirpath``. Owner's thread only; the
    one job it gives the sync thread (``_make``) shares nothing with it but its future."""

    def __init__(self, dirpath: str, capacity: int, file_mode: int, durability: Durability) -> None:
        self.dirpath = dirpath
        self.capacity = capacity
        self.file_mode = file_mode
        self._durability = durability
        self._number = 0
        self._future: Future[LogSegment] | None = None

    def create(self, number: int) -> LogSegment:
        """Make segment ``number`` here and now, durable (file, then directory entry)."""
        return self._make(number)

    def prepare(self, number: int, *, here: bool = False) -> None:
        """Make segment ``number`` ahead: on the sync thread, or ``here`` (blocking the caller).
        A failure to create it only means the rollover tries again, and meets the error
        there if it lasts; a failed directory fsync stops all writing (``Durability``)."""
        self.discard()
        self._number = number
        if not here:
            self._future = self._durability.submit(lambda: self._make(number))
            return
        self._future = Future()
        try:
            self._future.set_result(self._make(number))
        except StoreError as e:
            self._future.set_exception(e)
            self._durability.check_usable()  # a failed directory fsync: the open fails

    def take(self, number: int) -> LogSegment:
        """The segment to roll over to, ``number``: the one made ahead, else one made now.
        Raises what creating it raised, and :class:`StoreIOError` once writing stopped."""
        future, self._future = self._future, None
        if future is None or self._number != number:
            if future is not None:
                self._discard(future)
            return self._make(number)
        if not future.done():
            logger.debug("%s: waiting for log segment %d to be made", self.dirpath, number)
        try:
            segment = future.result()
        except StoreError as e:
            self._durability.check_usable()
            logger.debug("%s: log segment %d was not made ahead (%s); making it now", self.dirpath, number, e)
            return self._make(number)
        logger.debug("%s: log segment %d (made ahead)", self.dirpath, number)
        return segment

    @property
    def number(self) -> int | None:
        """The number of the segment made ahead, once it exists on disk; else None."""
        future = self._future
        if future is None or not future.done() or future.exception() is not None:
            return None
        return self._number

    def discard(self) -> None:
        """Delete the segment made ahead (it holds nothing), after waiting for it to be made."""
        future, self._future = self._future, None
        if future is not None:
            self._discard(future)

    def drop(self) -> None:
        """Close the segment made ahead and leave its file, as a crash does (for tests)."""
        future, self._future = self._future, None
        if future is not None and future.exception() is None:
            future.result().close()

    @staticmethod
    def _discard(future: Future[LogSegment]) -> None:
        if future.exception() is None:
            segment = future.result()
            segment.close()
            unlink_or_warn(segment.path)

    def _make(self, number: int) -> LogSegment:
        path = os.path.join(self.dirpath, log_name(number))
        segment = LogSegment.create(path, number, self.capacity, self.file_mode)  # header fsynced, renamed
        try:
            self._durability.write_back(lambda: fsync_dir(self.dirpath))  # the name is durable
        except BaseException:
            segment.close()  # writing has stopped; a reopen finds the file and uses it
            raise
        logger.debug("%s: new log segment %d", self.dirpath, number)
        return segment
