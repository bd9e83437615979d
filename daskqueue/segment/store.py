"""``SegmentStore``: one queue directory of log segments and an index, with its lock.

Owns the files; knows nothing of queues. Callers append log records and index records, then
``commit()``, which syncs according to the ``fsync`` policy (FORMAT.md, "Durability
settings"). Segments are pinned by the live records they hold and deleted when unpinned.

Not thread-safe: one owner at a time calls it: the queue actor on its event loop, or the
queue's compaction thread while the queue is paused (``QueueActorBase._run_paused``). The one
exception is syncing: ``sync_soon`` runs the msyncs and fsyncs on the store's own sync thread
(one, so syncs stay in order) while the owner goes on appending; a slow disk (NFS, Lustre)
then stalls that thread, not the owner's event loop.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Literal

from daskqueue import defaults
from daskqueue.errors import (
    CorruptRecordError,
    CorruptStoreError,
    ForeignDirectoryError,
    PayloadTooLargeError,
    StoreError,
    StoreFullError,
    StoreIOError,
    StoreLockedError,
)
from daskqueue.segment.format import (
    FILE_HEADER,
    LOCK_NAME,
    LOG_RECORD_HEADER,
    MARKER_NAME,
    MARKER_TEXT,
    IndexRecord,
    LogType,
    index_name,
    log_name,
)
from daskqueue.segment.index import Dropped, IndexSegment, Replayed, read_index
from daskqueue.segment.log import LogSegment, header_is_blank, os_errors, store_error

__all__ = ["SegmentStore", "FsyncPolicy"]

logger = logging.getLogger("daskqueue")

FsyncPolicy = Literal["always", "interval", "never"]

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
        if fsync not in ("always", "interval", "never"):
            raise ValueError(f"fsync must be 'always', 'interval' or 'never', got {fsync!r}")
        if max_segment_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"max_segment_bytes must be >= {MIN_SEGMENT_BYTES}, got {max_segment_bytes}")
        self.dirpath = os.path.abspath(dirpath)
        self.max_segment_bytes = max_segment_bytes
        self.fsync = fsync
        self.fsync_interval_s = fsync_interval_s
        self.compact_index_bytes = compact_index_bytes
        self.corruptions: list[CorruptRecordError] = []
        self.dropped: list[Dropped] = []  # what rules 3-5 gave up, in the order found
        self._on_corruption = on_corruption
        self._segments: dict[int, LogSegment] = {}
        self._pins: dict[int, int] = {}
        self._unpinned: set[int] = set()
        self._retained: set[int] = set()  # never deleted before the next compaction (rule 5)
        self._dirty_since: float | None = None
        self._sync_scheduled = False  # commit() told the owner of the pending interval sync
        self._lock_fd = -1
        self._lock_wait_s = lock_wait_s
        # A new directory gets ``dir_mode`` (default: the owner only); its files the same
        # bits without execute (0o600): payloads are pickles, and whoever can write them can
        # run code in the workers.
        self.dir_mode = dir_mode
        self.file_mode = dir_mode & 0o666
        self._failed: StoreError | None = None  # a failed write-back or roll-back: stop writing
        self._executor: ThreadPoolExecutor | None = None  # the sync thread, from the first sync_soon
        self._open_directory()
        try:
            self._open_files()
        except BaseException:
            self.close()
            raise

    # -- opening ------------------------------------------------------------------------------

    def _open_directory(self) -> None:
        path = self.dirpath
        if os.path.exists(path) and not os.path.isdir(path):
            raise StoreError(f"{path} exists and is not a directory")
        with os_errors(path, "use as a queue directory"):
            if not os.path.exists(path):
                os.makedirs(path, mode=self.dir_mode, exist_ok=True)
                os.chmod(path, self.dir_mode)  # makedirs' mode is masked by the umask
            entries = set(os.listdir(path))
        if MARKER_NAME in entries:
            self._check_marker()
        elif entries - {LOCK_NAME, MARKER_NAME + ".tmp"}:
            raise ForeignDirectoryError(
                f"{path} is not empty and is not a daskqueue store (no {MARKER_NAME} file)"
            )
        else:
            self._write_marker()
        self._lock()

    def _check_marker(self) -> None:
        marker = self._path(MARKER_NAME)
        with os_errors(marker, "read the store marker"):
            with open(marker, "rb") as f:
                text = f.read()
        if text != MARKER_TEXT:
            raise ForeignDirectoryError(f"{marker} is not a daskqueue store marker")

    def _write_marker(self) -> None:
        """Write the marker as ``.tmp``, fsynced, renamed: a crash leaves none or a whole one."""
        marker = self._path(MARKER_NAME)
        with os_errors(marker, "write the store marker"):
            with open(marker + ".tmp", "wb") as f:
                f.write(MARKER_TEXT)
                f.flush()
                os.fsync(f.fileno())
            os.replace(marker + ".tmp", marker)
            _fsync_dir(self.dirpath)

    def _flock_waiting(self, fd: int) -> None:
        """Take the lock, trying again for up to ``lock_wait_s`` while another holder has it
        (an actor of a pool whose client just died closes within seconds); raise
        ``BlockingIOError`` if it is still held then. Blocks the calling thread."""
        deadline = time.monotonic() + self._lock_wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def _lock(self) -> None:
        path = self._path(LOCK_NAME)
        with os_errors(path, "open the lock file"):
            self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, self.file_mode)
        try:
            self._flock_waiting(self._lock_fd)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise StoreLockedError(f"{self.dirpath} is open in another queue actor (its LOCK is held)") from None
        except OSError as e:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise store_error(e, path, "lock") from e

    def _open_files(self) -> None:
        # Rules 1-5 only decide; files change once every check has passed, so an open that
        # is refused leaves the directory as it was.
        with os_errors(self.dirpath, "list the queue directory"):
            names = os.listdir(self.dirpath)
        doomed = sorted(n for n in names if n.endswith(".tmp"))  # rule 1
        generations = _numbered(names, ".index")
        doomed += [index_name(g) for g in generations[:-1]]  # rule 1: older generations
        numbers = _numbered(names, ".log")
        if generations == [1] and not numbers and header_is_blank(self._path(index_name(1))):
            doomed.append(index_name(1))  # rule 2: a new store's first index, cut short
            generations = []
        if numbers and not generations:  # rule 1: logs without the index that explains them
            raise CorruptStoreError(
                f"{self.dirpath}: log segments {numbers} but no index file; refusing to open it "
                "as an empty queue (that would overwrite them). Nothing was modified."
            )
        unfinished = self._open_segments(numbers)  # rule 2
        replayed = read_index(self._path(index_name(generations[-1]))) if generations else None
        if unfinished is not None:
            self._check_unfinished(unfinished, replayed)  # rule 2
            doomed.append(log_name(unfinished))
        self._remove(doomed)
        self._open_index(generations[-1] if generations else None, replayed)
        self._last_compacted_size = self._index.size
        if not self._segments:
            self._new_segment(1)
        self.active = self._segments[max(self._segments)]
        self.active.end = self._append_point(self.active.number)

    def _open_segments(self, numbers: list[int]) -> int | None:
        """Open every segment by rule 2; return the newest's number if its header is blank
        (rule 2's exception: decided once the index is read), else None."""
        unfinished = None
        if numbers and header_is_blank(self._path(log_name(numbers[-1]))):
            unfinished = numbers[-1]
        for number in numbers:
            if number != unfinished:
                self._segments[number] = LogSegment.open(self._path(log_name(number)), number)
        return unfinished

    def _check_unfinished(self, number: int, replayed: Replayed | None) -> None:
        """Rule 2: a blank-headed newest segment that an index record names is refused; one no
        record names never held an acknowledged record (a crash interrupted its creation)."""
        if replayed is not None and any(r.segment == number for r in replayed.records):
            raise CorruptStoreError(
                f"{self._path(log_name(number))}: header is all zeros, yet the index names this segment"
            )

    def _remove(self, names: list[str]) -> None:
        """Rules 1 and 2: delete what an interrupted compaction or file creation left."""
        for name in names:
            logger.info("%s: deleting %s, left by an interrupted compaction or file creation", self.dirpath, name)
            with os_errors(self._path(name), "delete"):
                os.unlink(self._path(name))
        if names:
            self._sync_dir()

    def _open_index(self, generation: int | None, replayed: Replayed | None) -> None:
        """Open the newest index (rules 3-5: truncate its tail, report its corruption) or, in a
        new store, create generation 1."""
        if replayed is None or generation is None:
            self.generation = 1
            self._index = IndexSegment.create(self._path(index_name(1)), mode=self.file_mode)
            self.records = []
            self._sync_dir()
            return
        self.generation = generation
        self._index = IndexSegment.open(self._path(index_name(generation)), replayed.good_end)
        self.records = replayed.records
        for error in replayed.corruptions:
            self._report(error)
        if replayed.tail is not None:
            self.dropped.append(replayed.tail)

    def _append_point(self, number: int) -> int:
        """Rule 9: after the furthest record of segment ``number`` that the index references."""
        end = FILE_HEADER.size
        segment = self._segments[number]
        for r in self.records:
            if r.segment == number and r.offset + LOG_RECORD_HEADER.size <= segment.capacity:
                end = max(end, segment.record_end(r.offset))
        return min(end, segment.capacity)

    def _report(self, error: CorruptRecordError) -> None:
        logger.error("corruption: %s", error)
        self.corruptions.append(error)
        self.dropped.append(Dropped(5, error.path, error.offset, error.bytes_dropped, error.reason))
        # Rule 5: a skipped record may have been the only reference to acknowledged messages in
        # some segment; keep every segment there is now until compaction drops the damage.
        self._retained.update(self._segments)
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
        self._check_usable()
        length = sum(len(p) for p in parts)
        if length > self.max_record_body:
            raise PayloadTooLargeError(length, self.max_record_body)
        if not self.active.fits(length):
            self.active = self._new_segment(self.active.number + 1)
        offset = self.active.append(kind, *parts)
        self._mark_dirty()
        return self.active.number, offset

    def read_log(self, segment: int, offset: int) -> tuple[LogType, bytes]:
        seg = self._segments.get(segment)
        if seg is None:
            raise CorruptRecordError(self._path(log_name(segment)), offset, "log segment is missing", 0)
        return seg.read(offset)

    def append_index(self, records: list[IndexRecord]) -> None:
        self._check_usable()
        try:
            self._index.append(records)
        except StoreFullError:
            raise  # rolled back: the index is as it was
        except StoreError as e:
            self._fail(e)
            raise
        self._mark_dirty()

    def _mark_dirty(self) -> None:
        if self._dirty_since is None:
            self._dirty_since = time.monotonic()

    def _new_segment(self, number: int) -> LogSegment:
        segment = LogSegment.create(self._path(log_name(number)), number, self.max_segment_bytes, self.file_mode)
        self._segments[number] = segment  # closed by close() even if the next line fails
        self._sync_dir()
        logger.debug("%s: new log segment %d", self.dirpath, number)
        return segment

    # -- durability ---------------------------------------------------------------------------

    def commit(self) -> bool:
        """End of one call's writes. Under ``always`` the owner syncs (``sync_soon``) before
        it answers the call; under ``never``, when ``reclaim_due()``, it syncs the index so a
        retired segment can go; under ``interval`` it follows ``sync_due_in()``.

        Returns True when an ``interval`` sync became due that the owner has not been told
        about since the last sync (whoever ran it): the owner must then schedule one.
        """
        if self.fsync == "interval" and self._dirty_since is not None and not self._sync_scheduled:
            self._sync_scheduled = True
            return True
        return False

    def sync_due_in(self) -> float | None:
        """Seconds until an ``interval`` sync is due (0: now), or None if none is pending."""
        if self._dirty_since is None or self.fsync != "interval" or self._failed is not None:
            return None
        return max(0.0, self._dirty_since + self.fsync_interval_s - time.monotonic())

    @property
    def unsynced(self) -> bool:
        """Whether something was written since the last sync began."""
        return self._dirty_since is not None

    def reclaim_due(self) -> bool:
        """Under ``never``: a retired segment waits for an index sync to be deleted (disk is
        reclaimed under every policy, at one index fsync per retired segment)."""
        return self.fsync == "never" and bool(self._deletable())

    def sync(self) -> None:
        """msync the log appends, fsync the index, then delete segments left unpinned;
        return once done, after every sync started before (``sync_soon``).

        A failure (:class:`StoreIOError`, or :class:`StoreFullError` from a file system that
        allocates at write-back) makes the store refuse every later write: the kernel may have
        dropped the pages it could not write, so only a reopen knows what is on disk.
        """
        job = self._sync_job(index_only=False)
        if self._executor is None:
            job()
        else:
            self._executor.submit(job).result()

    def sync_soon(self, *, index_only: bool = False) -> Future[None]:
        """Start a sync of everything written so far on the store's sync thread and return
        its future: the caller's thread (an event loop) does not wait for the disk.

        Syncs run one at a time, in the order started; each covers the writes made before it
        started (later ones wait for the next). Segments retired by then are deleted by the
        sync, after the index fsync; the store stops tracking them at once. ``index_only``:
        fsync the index alone (what ``reclaim_due`` asks for).
        """
        job = self._sync_job(index_only=index_only)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="daskqueue-sync")
        return self._executor.submit(job)

    def _sync_job(self, *, index_only: bool) -> Callable[[], None]:
        """What a sync does, snapshotted on the owner's thread: the segments to msync, the
        index, and the retired segments (handed to the job, which deletes them)."""
        doomed = [self._segments.pop(n) for n in self._deletable() if n in self._segments]
        self._forget_unpinned()
        segments = [] if index_only else list(self._segments.values())
        index = self._index
        self._dirty_since = None
        self._sync_scheduled = False

        def job() -> None:
            try:
                for segment in segments:
                    self._write_back(segment.sync)
                self._write_back(index.sync)
            except BaseException:
                for segment in doomed:
                    segment.close()  # a next open deletes what is left (no pins)
                raise
            # After the index fsync: the records that settled these segments' last messages
            # are on disk, so no recovery will look for them.
            for segment in doomed:
                segment.close()
                _unlink_or_warn(segment.path)

        return job

    def wait_for_syncs(self) -> None:
        """Return once every sync started has ended (blocks the caller)."""
        if self._executor is not None:
            self._executor.submit(lambda: None).result()

    # -- segment lifetimes --------------------------------------------------------------------

    def pin(self, segment: int) -> None:
        """One more live record lives in ``segment``."""
        self._pins[segment] = self._pins.get(segment, 0) + 1
        self._unpinned.discard(segment)

    def unpin(self, segment: int) -> None:
        """A live record of ``segment`` died; the segment is deleted at the next sync if it
        is not the active one and nothing else lives there."""
        left = self._pins.get(segment, 0) - 1
        if left > 0:
            self._pins[segment] = left
            return
        self._pins.pop(segment, None)
        self._unpinned.add(segment)

    def reset_pins(self, pinned: dict[int, int]) -> None:
        """Replace every pin count (after recovery or compaction); unpinned segments go."""
        self._pins = dict(pinned)
        self._unpinned = set(self._segments) - set(pinned)

    def _deletable(self) -> list[int]:
        """Segments holding no live record, other than the active one and those rule 5 keeps."""
        return sorted(
            n for n in self._unpinned
            if n != self.active.number and not self._pins.get(n) and n not in self._retained
        )

    def _forget_unpinned(self) -> None:
        # An active segment emptied while active stays a candidate for when a rollover
        # retires it; retained ones come back with the pins compaction resets.
        active = self.active.number
        self._unpinned = {active} if active in self._unpinned and not self._pins.get(active) else set()

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
        self.sync()  # copied-forward log records must be on disk before the index names them
        nxt = self.generation + 1
        new = IndexSegment.create(self._path(index_name(nxt)), records, self.file_mode)  # fsynced, renamed
        old = self._index
        self._index, self.generation = new, nxt  # renamed into place: it is the index now
        self._retained.clear()  # the new index no longer holds the damaged records
        self._last_compacted_size = new.size
        self._sync_dir()
        old.close()
        _unlink_or_warn(old.path)  # rule 1 deletes an older generation left behind
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
            if getattr(self, "_index", None) is not None and self._segments and self._failed is None:
                self.sync()
        finally:
            if getattr(self, "_executor", None) is not None:
                self._executor.shutdown(wait=True)  # a failed sync: the ones before it end first
                self._executor = None
            for segment in self._segments.values():
                segment.close()
            self._segments.clear()
            if getattr(self, "_index", None) is not None:
                self._index.close()
            if self._lock_fd >= 0:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
                self._lock_fd = -1

    def _path(self, name: str) -> str:
        return os.path.join(self.dirpath, name)

    # -- failure ------------------------------------------------------------------------------

    def _sync_dir(self) -> None:
        """fsync the directory (new or renamed names); a failure stops all writing."""
        self._write_back(lambda: _fsync_dir(self.dirpath))

    def _write_back(self, sync: Callable[[], None]) -> None:
        """Run one msync/fsync; if it fails, no later write is accepted (see ``sync``)."""
        self._check_usable()
        try:
            with os_errors(self.dirpath, "fsync"):  # _fsync_dir's errors; the rest wrap their own
                sync()
        except StoreError as e:
            self._fail(e)
            raise

    def _fail(self, error: StoreError) -> None:
        logger.error("%s: %s; refusing further writes until the queue is reopened", self.dirpath, error)
        self._failed = error

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise StoreIOError(
                self.dirpath, "write", getattr(self._failed, "errno", None),
                f"refused after an earlier failure ({self._failed}); reopen the queue",
            ) from self._failed


def _numbered(names: list[str], suffix: str) -> list[int]:
    """The numbers of the files named ``<number><suffix>``, ascending."""
    stems = (n[: -len(suffix)] for n in names if n.endswith(suffix))
    return sorted(int(stem) for stem in stems if stem.isdigit())


def _unlink_or_warn(path: str) -> None:
    try:
        os.unlink(path)
        logger.debug("deleted %s", path)
    except OSError as e:
        logger.warning("cannot delete %s (%s); the next open will", path, e)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
