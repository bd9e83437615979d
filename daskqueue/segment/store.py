"""``SegmentStore``: one queue directory of log segments and an index, with its lock.

Owns the files; knows nothing of queues. Callers append log records and index records, then
``commit()``, which syncs according to the ``fsync`` policy (FORMAT.md, "Durability
settings"). Segments are pinned by the live records they hold and deleted when unpinned.

Not thread-safe: one owner at a time calls it: the queue actor on its event loop, or the
queue's compaction thread while the queue is paused (``QueueActorBase._run_paused``). The
exceptions are the waits for the disk: ``sync_soon`` runs the msyncs and fsyncs on the
store's own sync thread (one, so syncs stay in order) while the owner goes on appending, and
the next log segment is made ahead on that thread too; a slow disk (NFS, Lustre) then stalls
that thread, not the owner's event loop.

The store's jobs live in modules of their own: the marker and lock (``lockfile``), opening
by the recovery rules (``opening``), the sync thread and its bookkeeping (``durability``),
which segments may go (``lifetimes``), the next segment, made ahead (``rotation``).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future
from typing import Callable

from daskqueue import defaults
from daskqueue.errors import CorruptRecordError, PayloadTooLargeError, StoreError, StoreFullError
from daskqueue.segment.durability import Durability, FsyncPolicy
from daskqueue.segment.format import FILE_HEADER, LOG_RECORD_HEADER, IndexRecord, LogType, index_name, log_name
from daskqueue.segment.index import Dropped, IndexSegment
from daskqueue.segment.lifetimes import SegmentLifetimes
from daskqueue.segment.lockfile import DirectoryLock, fsync_dir, prepare_directory, unlink_or_warn
from daskqueue.segment.log import LogSegment, os_errors
from daskqueue.segment.opening import append_point, open_files
from daskqueue.segment.rotation import NextSegment

__all__ = ["SegmentStore", "FsyncPolicy"]

logger = logging.getLogger("daskqueue")

MIN_SEGMENT_BYTES = defaults.MIN_SEGMENT_BYTES  # one page: a header and records of a useful size


class SegmentStore:
    """The files of one durable queue. Opening it applies recovery rules 1-5 and 9.

    ``records`` holds the replayed index records until the owner has read them
    (``take_records()``); ``corruptions`` every :class:`CorruptRecordError` reported;
    ``dropped`` every torn tail, zero fill and corrupt record recovery gave up (``Dropped``).
    """

    def __init__(
        self,
        dirpath: str,
        *,
        max_segment_bytes: int = 64 * 2**20,
        fsync: FsyncPolicy = "interval",
        fsync_interval_s: float = 0.1,
        compact_index_bytes: int = 16 * 2**20,
        on_corruption: Callable[[CorruptRecordError], None] | None = None,
        lock_wait_s: float = 0.0,
        dir_mode: int = 0o700,
    ) -> None:
        self.dirpath = os.path.abspath(dirpath)
        self._durability = Durability(self.dirpath, fsync, fsync_interval_s)  # checks ``fsync``
        if max_segment_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"max_segment_bytes must be >= {MIN_SEGMENT_BYTES}, got {max_segment_bytes}")
        self.max_segment_bytes = max_segment_bytes
        self.compact_index_bytes = compact_index_bytes
        self.corruptions: list[CorruptRecordError] = []
        self.dropped: list[Dropped] = []  # what rules 3-5 gave up, in the order found
        self._on_corruption = on_corruption
        self._segments: dict[int, LogSegment] = {}
        self._index: IndexSegment | None = None
        self._lifetimes = SegmentLifetimes()
        self._lock: DirectoryLock | None = None
        self._next = NextSegment(self.dirpath, max_segment_bytes, dir_mode & 0o666, self._durability)
        # A new directory gets ``dir_mode`` (default: the owner only); its files the same
        # bits without execute (0o600): payloads are pickles, and whoever can write them can
        # run code in the workers.
        self.dir_mode = dir_mode
        self.file_mode = dir_mode & 0o666
        prepare_directory(self.dirpath, dir_mode)
        self._lock = DirectoryLock(self.dirpath, self.file_mode, lock_wait_s)
        try:
            self._open_files()
        except BaseException:
            self.close()
            raise

    def _open_files(self) -> None:
        opened = open_files(self.dirpath, self.file_mode)
        self._segments, self._index, self.generation = opened.segments, opened.index, opened.generation
        self.records = opened.records
        for error in opened.corruptions:
            self._report(error)
        if opened.tail is not None:
            self.dropped.append(opened.tail)
        self._last_compacted_size = self._index.size
        if not self._segments:
            self._segments[1] = self._next.create(1)
        self.active = self._segments[max(self._segments)]
        self.active.end = append_point(self.active, self.records)  # rule 9
        self._next.prepare(self.active.number + 1, here=True)

    @property
    def fsync(self) -> FsyncPolicy:
        return self._durability.fsync

    @property
    def fsync_interval_s(self) -> float:
        return self._durability.interval_s

    @property
    def _pins(self) -> dict[int, int]:
        """The pin count of each segment (read by tests)."""
        return self._lifetimes.pins

    def _report(self, error: CorruptRecordError) -> None:
        logger.error("corruption: %s", error)
        self.corruptions.append(error)
        self.dropped.append(Dropped(5, error.path, error.offset, error.bytes_dropped, error.reason))
        # Rule 5: a skipped record may have been the only reference to acknowledged messages in
        # some segment; keep every segment there is now until compaction drops the damage.
        self._lifetimes.retain(self._segments)
        if self._on_corruption is not None:
            self._on_corruption(error)

    def take_records(self) -> list[IndexRecord]:
        """The replayed index records (once; the store forgets them)."""
        records, self.records = self.records, []
        return records

    def report(self, error: CorruptRecordError) -> None:
        """Report corruption found by the owner while reading the log during recovery."""
        self._report(error)

    # -- appending ----------------------------------------------------------------------------

    @property
    def max_record_body(self) -> int:
        """The largest log record body one segment can hold."""
        return self.max_segment_bytes - FILE_HEADER.size - LOG_RECORD_HEADER.size

    def append_log(self, kind: LogType, *parts: bytes | memoryview) -> tuple[int, int]:
        """Append a log record to the active segment (rolling over if full); return
        ``(segment, offset)``. Raises :class:`PayloadTooLargeError` if no segment can hold it."""
        self._durability.check_usable()
        length = sum(len(p) for p in parts)
        if length > self.max_record_body:
            raise PayloadTooLargeError(length, self.max_record_body)
        if not self.active.fits(length):
            self._roll_over()
        offset = self.active.append(kind, *parts)
        self._durability.mark_dirty()
        return self.active.number, offset

    def read_log(self, segment: int, offset: int) -> tuple[LogType, bytes]:
        seg = self._segments.get(segment)
        if seg is None:
            raise CorruptRecordError(self._path(log_name(segment)), offset, "log segment is missing", 0)
        return seg.read(offset)

    def append_index(self, records: list[IndexRecord]) -> None:
        self._durability.check_usable()
        try:
            self._index.append(records)
        except StoreFullError:
            raise  # rolled back: the index is as it was
        except StoreError as e:
            self._durability.fail(e)
            raise
        self._durability.mark_dirty()

    def _roll_over(self) -> None:
        """Make the next segment the active one. It was made ahead, durable (``rotation``):
        no fsync here, on the owner's thread; then the one after it is started."""
        number = self.active.number + 1
        self._segments[number] = self.active = self._next.take(number)
        self._next.prepare(number + 1)

    @property
    def spare_number(self) -> int | None:
        """The number of the segment made ahead for the next rollover, once it is on disk
        (it holds nothing; not one of ``segment_numbers()``)."""
        return self._next.number

    # -- durability ---------------------------------------------------------------------------

    def commit(self) -> bool:
        """End of one call's writes. Under ``always`` the owner syncs (``sync_soon``) before
        it answers the call; under ``never``, when ``reclaim_due()``, it syncs the index so a
        retired segment can go; under ``interval`` it follows ``sync_due_in()``.

        Returns True when an ``interval`` sync became due that the owner has not been told
        about since the last sync (whoever ran it): the owner must then schedule one.
        """
        return self._durability.commit()

    def sync_due_in(self) -> float | None:
        """Seconds until an ``interval`` sync is due (0: now), or None if none is pending."""
        return self._durability.due_in()

    @property
    def unsynced(self) -> bool:
        """Whether something was written since the last sync began."""
        return self._durability.unsynced

    def reclaim_due(self) -> bool:
        """Under ``never``: a retired segment waits for an index sync to be deleted (disk is
        reclaimed under every policy, at one index fsync per retired segment)."""
        return self.fsync == "never" and bool(self._lifetimes.deletable(self.active.number))

    def sync(self) -> None:
        """msync the log appends, fsync the index, then delete segments left unpinned;
        return once done, after every sync started before (``sync_soon``).

        A failure (:class:`StoreIOError`, or :class:`StoreFullError` from a file system that
        allocates at write-back) makes the store refuse every later write: the kernel may have
        dropped the pages it could not write, so only a reopen knows what is on disk.
        """
        self._durability.run(self._sync_job(index_only=False))

    def sync_soon(self, *, index_only: bool = False) -> Future[None]:
        """Start a sync of everything written so far on the store's sync thread and return
        its future: the caller's thread (an event loop) does not wait for the disk.

        Syncs run one at a time, in the order started; each covers the writes made before it
        started (later ones wait for the next). Segments retired by then are deleted by the
        sync, after the index fsync; the store stops tracking them at once. ``index_only``:
        fsync the index alone (what ``reclaim_due`` asks for).
        """
        return self._durability.submit(self._sync_job(index_only=index_only))

    def _sync_job(self, *, index_only: bool, reclaim: bool = True) -> Callable[[], None]:
        """What a sync does, snapshotted on the owner's thread: the segments to msync, the
        index, and (``reclaim``) the retired segments, handed to the job, which deletes them."""
        active = self.active.number
        doomed = []
        if reclaim:
            doomed = [self._segments.pop(n) for n in self._lifetimes.deletable(active) if n in self._segments]
            self._lifetimes.forget_unpinned(active)
        segments = [] if index_only else list(self._segments.values())
        index = self._index
        durability = self._durability
        durability.begin()

        def job() -> None:
            try:
                for segment in segments:
                    durability.write_back(segment.sync)
                durability.write_back(index.sync)
            except BaseException:
                for segment in doomed:
                    segment.close()  # a next open deletes what is left (no pins)
                raise
            # After the index fsync: the records that settled these segments' last messages
            # are on disk, so no recovery will look for them.
            for segment in doomed:
                segment.close()
                unlink_or_warn(segment.path)

        return job

    def wait_for_syncs(self) -> None:
        """Return once every sync started has ended (blocks the caller)."""
        self._durability.wait()

    # -- segment lifetimes --------------------------------------------------------------------

    def pin(self, segment: int) -> None:
        """One more live record lives in ``segment``."""
        self._lifetimes.pin(segment)

    def unpin(self, segment: int) -> None:
        """A live record of ``segment`` died; the segment is deleted at the next sync if it
        is not the active one and nothing else lives there."""
        self._lifetimes.unpin(segment)

    def reset_pins(self, pinned: dict[int, int]) -> None:
        """Replace every pin count (after recovery or compaction); unpinned segments go."""
        self._lifetimes.reset(pinned, self._segments)

    # -- compaction ---------------------------------------------------------------------------

    @property
    def index_bytes(self) -> int:
        return self._index.size

    def needs_compaction(self) -> bool:
        return self._index.size > max(self.compact_index_bytes, 2 * self._last_compacted_size)

    def postpone_compaction(self) -> None:
        """After a failed compaction: the next attempt comes once the index has doubled."""
        self._last_compacted_size = self._index.size

    def replace_index(self, records: list[bytes]) -> None:
        """Compaction: make ``records`` (each ``IndexRecord.to_bytes()``) the whole index,
        crash-safely (FORMAT.md)."""
        # Copied-forward log records must be on disk before the index names them. No segment
        # is deleted by this sync: the pins are the old index's until the owner resets them,
        # and a segment emptied while active may hold copies now (and no longer be active).
        self._durability.run(self._sync_job(index_only=False, reclaim=False))
        nxt = self.generation + 1
        new = IndexSegment.create(self._path(index_name(nxt)), records, self.file_mode)  # fsynced, renamed
        old = self._index
        self._index, self.generation = new, nxt  # renamed into place: it is the index now
        self._lifetimes.release_retained()  # the new index no longer holds the damaged records
        self._last_compacted_size = new.size
        self._sync_dir()
        old.close()
        unlink_or_warn(old.path)  # rule 1 deletes an older generation left behind
        logger.info("%s: compacted the index to %d records (%d bytes)", self.dirpath, len(records), new.size)

    # -- inspection and closing ---------------------------------------------------------------

    def disk_bytes(self) -> int:
        """Bytes allocated on disk by the store's files (sparse space not counted)."""
        total = 0
        with os_errors(self.dirpath, "list the queue directory"):
            names = os.listdir(self.dirpath)
        for name in names:
            try:
                total += os.stat(self._path(name)).st_blocks * 512
            except FileNotFoundError:
                pass
        return total

    def segment_numbers(self) -> list[int]:
        return sorted(self._segments)

    def close(self) -> None:
        """Sync and release everything, the lock last. Idempotent."""
        try:
            if self._index is not None and self._segments and not self._durability.failed:
                self.sync()
        finally:
            self._durability.shutdown()  # a failed sync: the ones before it end first
            self._next.discard()  # holds nothing: at a reopen it would only become the active one
            for segment in self._segments.values():
                segment.close()
            self._segments.clear()
            if self._index is not None:
                self._index.close()
            if self._lock is not None:
                self._lock.release()

    def _path(self, name: str) -> str:
        return os.path.join(self.dirpath, name)

    def _sync_dir(self) -> None:
        """fsync the directory (new or renamed names); a failure stops all writing."""
        self._durability.write_back(lambda: fsync_dir(self.dirpath))
