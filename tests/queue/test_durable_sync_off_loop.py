"""A durable queue's syncs run off the event loop: a slow fsync (NFS, Lustre) stalls the
store's sync thread, never the worker's loop, while the contract holds: under
``fsync="always"`` a put is answered only once its data is fsynced, and ``close`` waits for
the syncs started before it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.helpers import wait_until_async
from tests.queue.test_compaction_off_loop import LoopWatch
from tests.segment.helpers import drain, open_queue, put

SLOW_FSYNC_S = 0.5
LOOP_STALL_LIMIT_S = 0.2  # well under one slow fsync


class SlowFsync:
    """``os.fsync`` (the index) that sleeps first; counts the fsyncs begun and ended, and
    which thread ran them. ``os.fdatasync`` (a log segment's msync on Linux) sleeps too."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.begun = self.ended = 0
        self.threads: set[str] = set()
        self._real, real_fdatasync = os.fsync, os.fdatasync
        monkeypatch.setattr(os, "fsync", self)
        monkeypatch.setattr(os, "fdatasync", lambda fd: (time.sleep(SLOW_FSYNC_S), real_fdatasync(fd)))

    def __call__(self, fd: int) -> None:
        self.begun += 1
        self.threads.add(threading.current_thread().name)
        time.sleep(SLOW_FSYNC_S)
        self._real(fd)
        self.ended += 1


async def test_a_put_under_always_waits_for_a_slow_fsync_but_the_loop_does_not(tmp_path, monkeypatch):
    q = open_queue(tmp_path, fsync="always")
    await put(q, ["warm up"])
    fsync = SlowFsync(monkeypatch)
    async with LoopWatch() as watch:
        started = time.perf_counter()
        await put(q, ["a"])
        took_s = time.perf_counter() - started
    assert fsync.ended >= 1 and fsync.begun == fsync.ended  # answered after its fsync ended
    assert took_s >= SLOW_FSYNC_S
    assert watch.max_gap_s < LOOP_STALL_LIMIT_S, watch.max_gap_s
    assert threading.main_thread().name not in fsync.threads
    monkeypatch.undo()
    await q.close()
    assert set(v for v, _ in (await drain(open_queue(tmp_path))).values()) == {"warm up", "a"}


async def test_the_interval_sync_runs_off_the_loop_and_close_waits_for_it(tmp_path, monkeypatch):
    q = open_queue(tmp_path, fsync="interval", fsync_interval_s=0.01)
    fsync = SlowFsync(monkeypatch)
    async with LoopWatch() as watch:
        await put(q, ["a"])
        await wait_until_async(lambda: fsync.begun >= 1, timeout_s=10)
        await put(q, ["b"])  # answered while the sync is under way
        assert fsync.ended == 0
    assert watch.max_gap_s < LOOP_STALL_LIMIT_S, watch.max_gap_s
    await q.close()
    assert fsync.begun == fsync.ended >= 1  # close returned after every sync ended
    monkeypatch.undo()
    assert set(v for v, _ in (await drain(open_queue(tmp_path))).values()) == {"a", "b"}


async def test_writes_made_during_a_sync_are_synced_by_the_next_one(tmp_path, monkeypatch):
    q = open_queue(tmp_path, fsync="interval", fsync_interval_s=0.01)
    fsync = SlowFsync(monkeypatch)
    await put(q, ["a"])
    await wait_until_async(lambda: fsync.begun >= 1, timeout_s=10)
    await put(q, ["b"])  # after the first sync took its snapshot
    await wait_until_async(lambda: fsync.ended >= 2, timeout_s=10)
    assert not q._store.unsynced
    monkeypatch.undo()
    await q.close()
