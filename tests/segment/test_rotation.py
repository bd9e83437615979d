"""Log segment rollover waits for no disk on the owner's loop: the next segment is made ahead
on the store's sync thread (``segment/rotation.py``), durable (its header, its name and the
directory entry) before any record goes into it."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from daskqueue.errors import StoreFullError
from daskqueue.segment import rotation
from daskqueue.segment.format import log_name
from daskqueue.segment.log import LogSegment
from tests.queue.test_compaction_off_loop import LoopWatch
from tests.queue.test_durable_sync_off_loop import LOOP_STALL_LIMIT_S, SLOW_FSYNC_S, SlowFsync
from tests.segment.helpers import crash, drain, open_queue, put

SEG = 16384
ITEM = b"x" * 9000  # two do not fit in one segment: every second put rolls over


@pytest.mark.parametrize("fsync", ["always", "never"])
async def test_a_rollover_under_a_slow_fsync_does_not_block_the_loop(tmp_path, monkeypatch, fsync):
    q = open_queue(tmp_path, fsync=fsync, max_segment_bytes=SEG)
    await put(q, [ITEM])
    slow = SlowFsync(monkeypatch)
    async with LoopWatch() as watch:
        started = time.perf_counter()
        await put(q, [ITEM])  # rolls over to segment 2, made ahead; segment 3 is started
        took_s = time.perf_counter() - started
        assert q._store.active.number == 2
    assert watch.max_gap_s < LOOP_STALL_LIMIT_S, watch.max_gap_s
    if fsync == "always":
        assert took_s >= SLOW_FSYNC_S  # answered after its sync, on the sync thread
    q._store.wait_for_syncs()
    assert slow.begun >= 2 and threading.main_thread().name not in slow.threads  # file and directory
    assert q._store.spare_number == 3
    monkeypatch.undo()
    await q.close()
    assert not (tmp_path / log_name(3)).exists()  # a clean close deletes the one made ahead
    assert [v for v, _ in (await drain(open_queue(tmp_path, max_segment_bytes=SEG))).values()] == [ITEM, ITEM]


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
async def test_no_record_goes_into_a_segment_whose_name_is_not_durable_yet(tmp_path, monkeypatch, fsync):
    """The durability contract of a rollover, one put spanning many segments included (the
    rollover then waits for the segments the sync thread has not made yet)."""
    durable: set[str] = set()  # log files whose directory entry was fsynced
    real_fsync_dir, real_append = rotation.fsync_dir, LogSegment.append

    def fsync_dir(path):
        names = set(os.listdir(path))
        real_fsync_dir(path)
        durable.update(n for n in names if n.endswith(".log"))

    def append(self, *args):
        assert os.path.basename(self.path) in durable, f"a record went into {self.path} before its name was durable"
        return real_append(self, *args)

    monkeypatch.setattr(rotation, "fsync_dir", fsync_dir)
    monkeypatch.setattr(LogSegment, "append", append)
    q = open_queue(tmp_path, fsync=fsync, max_segment_bytes=SEG)
    await put(q, [ITEM] * 7)  # one put: segments 1 to 7
    await put(q, [ITEM])
    assert q._store.segment_numbers() == list(range(1, 9))
    await q.close()
    monkeypatch.undo()
    assert len(await drain(open_queue(tmp_path, max_segment_bytes=SEG))) == 8


async def test_a_segment_made_ahead_and_left_by_a_crash_becomes_the_active_one(tmp_path):
    q = open_queue(tmp_path, max_segment_bytes=SEG)
    await put(q, [ITEM, b"a"])
    assert q._store.segment_numbers() == [1] and q._store.spare_number == 2
    crash(q)
    assert (tmp_path / log_name(2)).exists()
    q = open_queue(tmp_path, max_segment_bytes=SEG)
    # Rule 9: the highest-numbered segment is the active one; it holds no record yet.
    assert q._store.active.number == 2 and q._store.spare_number == 3
    assert (await q.recovery_report())["corruptions"] == []
    await put(q, [b"b"])
    crash(q)
    q = open_queue(tmp_path, max_segment_bytes=SEG)
    assert [v for v, _ in (await drain(q)).values()] == [ITEM, b"a", b"b"]


async def test_a_segment_that_could_not_be_made_ahead_is_made_at_the_rollover(tmp_path, monkeypatch):
    """A full disk while the sync thread makes the next segment fails the put that needs it,
    with its type, as the rollover itself would; once there is room, the rollover makes it."""
    real_fallocate = os.posix_fallocate

    def full_for_new_segments(fd, offset, length):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fallocate(fd, offset, length)

    q = open_queue(tmp_path, max_segment_bytes=SEG)
    await put(q, [ITEM])
    monkeypatch.setattr(os, "posix_fallocate", full_for_new_segments)
    await put(q, [ITEM])  # segment 2 was made at open; making segment 3 ahead fails
    q._store.wait_for_syncs()
    assert q._store.spare_number is None
    with pytest.raises(StoreFullError):
        await put(q, [ITEM])  # needs segment 3
    monkeypatch.undo()
    await put(q, [ITEM])  # the store stays usable
    assert q._store.segment_numbers() == [1, 2, 3]
    crash(q)
    assert [v for v, _ in (await drain(open_queue(tmp_path, max_segment_bytes=SEG))).values()] == [ITEM] * 3
