"""A durable queue whose storage fails while it persists a settle, a lease or a lease expiry.

The outcome of a failed write stays pending and goes out, in order, with the next write that
succeeds; a crash and reopen then shows every acknowledged outcome, nothing acked delivered
again, and no message lost. Real files; failures are injected at the system call (a full disk
is ENOSPC, an I/O error EIO). No Dask.
"""

from __future__ import annotations

import asyncio
import errno
import os
import pickle

import pytest

from daskqueue.errors import LeaseExpiredError, StoreError, StoreFullError, StoreIOError
from daskqueue.queue.core import LEASE_EXPIRED
from daskqueue.serialize import ResultRecord, decode_delivery, encode_settle
from tests.helpers import wait_until_async
from tests.segment.helpers import crash, drain, get, open_queue, put


def fail_index_writes(q, monkeypatch, code):
    """Every write to ``q``'s index fails with ``code``: ENOSPC is a full disk (rolled back,
    the store stays usable); EIO makes the store refuse every later write."""
    real_write = os.write

    def write(fd, data):
        if fd == q._store._index._fd:
            raise OSError(code, os.strerror(code))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def fail_log_reservations(monkeypatch, *, after):
    """Log appends fail with EIO (reserving their blocks) once ``after`` have succeeded;
    the store stays usable."""
    real = os.posix_fallocate
    calls = []

    def reserve(fd, offset, length):
        calls.append(length)
        if len(calls) > after:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", reserve)
    return calls


async def settle_with(q, lease_id, values, *, fatal=()):
    """Settle with a result per message; positions in ``fatal`` failed for good."""
    errors = {pos: b"boom %d" % pos for pos in fatal}
    blob = encode_settle(len(values), errors, set(fatal), pickle.dumps(values))
    return await q.settle(lease_id, blob)


async def results_of(q):
    """``{seq: value}`` of every unfetched result record (fetching from 0 drops nothing)."""
    _, blob = await q.fetch_results(0)
    out = {}
    for record in map(ResultRecord._make, pickle.loads(blob)):
        values = iter(pickle.loads(record.results))
        out.update((first + k, next(values)) for first, count in record.ranges for k in range(count))
    return out


async def dead_of(q):
    """``{seq: (attempts, error)}`` of the dead letters."""
    _, dead = await q.fetch_dead(0)
    return {seq: (attempts, error) for seq, attempts, error, _ in dead}


async def assert_recovered_intact(q):
    report = await q.recovery_report()
    assert (report["lost_messages"], report["corruptions"], report["dropped"]) == (0, [], [])


# -- settle -----------------------------------------------------------------------------------


def inject_full_index(q, monkeypatch):
    fail_index_writes(q, monkeypatch, errno.ENOSPC)
    return StoreFullError


def inject_eio_on_the_error_record(q, monkeypatch):
    fail_log_reservations(monkeypatch, after=1)  # the RESULT record gets in, the ERROR not
    return StoreIOError


@pytest.mark.parametrize("inject", [inject_full_index, inject_eio_on_the_error_record])
async def test_a_failed_settle_goes_out_with_the_next_write_and_loses_no_acked_outcome(
    tmp_path, monkeypatch, inject
):
    q = open_queue(tmp_path)
    await put(q, ["a0", "a1", "a2"])
    await put(q, ["b0", "b1"])
    lease_a, _ = await get(q, 3)
    lease_b, _ = await get(q, 2)
    error_type = inject(q, monkeypatch)
    with pytest.raises(error_type):
        await settle_with(q, lease_a, ["ra0", "ra1", None], fatal={2})
    monkeypatch.undo()
    with pytest.raises(LeaseExpiredError):  # it took effect: the lease is gone
        await settle_with(q, lease_a, ["ra0", "ra1", None], fatal={2})
    assert await settle_with(q, lease_b, ["rb0", "rb1"]) == (2, 0, 0, 0)
    pins = dict(q._store._pins)  # converted once: one ERROR record, each pin counted once

    crash(q)
    q = open_queue(tmp_path)
    await assert_recovered_intact(q)
    assert q._store._pins == pins
    assert await results_of(q) == {0: "ra0", 1: "ra1", 2: None, 3: "rb0", 4: "rb1"}
    assert await dead_of(q) == {2: (1, b"boom 2")}
    assert await drain(q) == {}  # nothing acked comes back


async def test_a_getter_waiting_is_woken_by_the_release_of_a_settle_storage_refused(tmp_path, monkeypatch):
    q = open_queue(tmp_path)
    await put(q, ["m0", "m1"])
    lease, _ = await get(q)
    waiter = asyncio.ensure_future(q.get_batch(10, 20.0))
    await wait_until_async(lambda: q._get_calls == 2)  # it waits for a ready message
    fail_index_writes(q, monkeypatch, errno.ENOSPC)
    with pytest.raises(StoreFullError):
        await q.settle(lease, encode_settle(1, {}, set(), pickle.dumps(["r0"])))  # m1 released
    monkeypatch.undo()
    blob = await asyncio.wait_for(waiter, 5.0)
    _, _, segments = decode_delivery(blob)
    assert [(s.first_seq, s.count, s.attempts) for s in segments] == [(1, 1, 0)]


# -- lease (get_batch) ------------------------------------------------------------------------


async def assert_lease_refused_and_given_back(q, monkeypatch, error_number, error_type):
    """A get_batch whose LEASE records the index refuses raises, and its two ready messages
    are ready again: not leased to nobody until the lease expires."""
    fail_index_writes(q, monkeypatch, error_number)
    with pytest.raises(error_type):
        await q.get_batch(10, 0.0)
    monkeypatch.undo()
    stats = await q.stats()
    assert (stats.ready, stats.leased) == (2, 0)


async def test_a_lease_a_full_disk_refused_is_given_back_and_served_again(tmp_path, monkeypatch):
    q = open_queue(tmp_path)
    await put(q, ["m0", "m1"])
    await assert_lease_refused_and_given_back(q, monkeypatch, errno.ENOSPC, StoreFullError)
    lease, items = await get(q)
    assert items == [(0, "m0", 0), (1, "m1", 0)]  # no attempt counted
    assert await settle_with(q, lease, ["r0", "r1"]) == (2, 0, 0, 0)

    crash(q)
    q = open_queue(tmp_path)
    await assert_recovered_intact(q)
    assert await results_of(q) == {0: "r0", 1: "r1"}
    assert await drain(q) == {}


async def test_a_lease_an_io_error_refused_is_given_back_and_the_reopened_queue_has_it_all(
    tmp_path, monkeypatch
):
    q = open_queue(tmp_path)
    await put(q, ["done"])
    lease, _ = await get(q)
    assert await settle_with(q, lease, ["r"]) == (1, 0, 0, 0)
    await put(q, ["m0", "m1"])
    await assert_lease_refused_and_given_back(q, monkeypatch, errno.EIO, StoreIOError)
    with pytest.raises(StoreIOError):  # the store refuses every write until it is reopened
        await q.get_batch(10, 0.0)
    assert (await q.stats()).ready == 2

    crash(q)
    q = open_queue(tmp_path)
    await assert_recovered_intact(q)
    assert await results_of(q) == {0: "r"}
    assert await drain(q) == {1: ("m0", 0), 2: ("m1", 0)}


# -- lease expiry (the sweeper) ---------------------------------------------------------------


def inject_eio_on_the_second_error_record(q, monkeypatch):
    fail_log_reservations(monkeypatch, after=1)
    return StoreIOError


@pytest.mark.parametrize("inject", [inject_full_index, inject_eio_on_the_second_error_record])
async def test_a_failed_expiry_goes_out_with_the_next_write_and_its_segment_outlives_it(
    tmp_path, monkeypatch, inject
):
    # P's chunk in segment 1 with an acked one, Q's in segment 2 behind a filler that keeps
    # it pinned: once P's dead letter counts as written, segment 1 may go at the next sync.
    q = open_queue(tmp_path, max_segment_bytes=8192, max_retries=0, lease_timeout_s=0.2)
    await put(q, [bytes(5000)], priority=2)
    await put(q, ["p"], priority=1)
    lease, _ = await get(q, 1)
    assert await settle_with(q, lease, [None]) == (1, 0, 0, 0)
    await q.fetch_results(10**9)  # its result fetched: nothing but P keeps segment 1
    await put(q, [bytes(5001)])
    await put(q, ["q"], priority=1)
    assert sorted(q._store._segments) == [1, 2]
    _, items = await get(q, 2)
    assert [item for _, item, _ in items] == ["p", "q"]
    inject(q, monkeypatch)
    await wait_until_async(lambda: len(q._core.dead) == 2)  # the sweeper expired the lease
    monkeypatch.undo()
    await put(q, ["after"])  # a write that succeeds (and syncs, retiring segment 1 if it may)

    crash(q)
    q = open_queue(tmp_path, max_segment_bytes=8192, max_retries=0)
    await assert_recovered_intact(q)
    assert await dead_of(q) == {1: (1, LEASE_EXPIRED), 3: (1, LEASE_EXPIRED)}
    assert [item for item, _ in (await drain(q)).values()] == [bytes(5001), "after"]
