"""Drive a DurableQueue without Dask: blobs in, blobs out, and a simulated process crash."""

from __future__ import annotations

import asyncio
import glob
import os
import pickle

from daskqueue.messages import Kind
from daskqueue.queue.durable import DurableQueue
from daskqueue.segment.format import log_name
from daskqueue.serialize import Group, decode_delivery, encode_put, encode_settle, pack_payloads


def put_blob(items, *, priority=0, delay_s=0.0):
    offsets, data = pack_payloads(items, max_message_bytes=2**30)
    return encode_put([Group(Kind.RAW, None, None, priority, None, delay_s, len(items), offsets, data)], {})


async def put(q, items, **kw):
    return await q.put_batch(put_blob(items, **kw))


async def get(q, n=1000):
    """``(lease_id, [(seq, item, attempts), ...])``, or ``(None, [])``."""
    blob = await q.get_batch(n, 0.0)
    if blob is None:
        return None, []
    lease_id, _, segments = decode_delivery(blob)
    return lease_id, [
        (s.first_seq + j, pickle.loads(p), s.attempts) for s in segments for j, p in enumerate(s.payloads())
    ]


async def settle(q, lease_id, done, errors=None):
    return await q.settle(lease_id, encode_settle(done, errors or {}, set(), pickle.dumps([None] * done)))


async def drain(q):
    """Everything ready now, as ``{seq: (item, attempts)}``, acked."""
    out = {}
    while True:
        lease, items = await get(q)
        if lease is None:
            return out
        out.update({seq: (item, a) for seq, item, a in items})
        await settle(q, lease, len(items))


async def background_done(q):
    """Yield to the loop until the compaction due, if any, has run (or failed) on the sweeper.

    A test's tight loop of calls that never wait gives the sweeper no turn; a worker, serving
    calls one message at a time, does.
    """
    while q._compaction_due or q._paused is not None:
        await asyncio.sleep(0.001)


def crash(q, *, made_ahead=True):
    """Drop the queue like a killed process: release its descriptors, write and sync nothing.

    The next log segment, made ahead of the rollover, stays on disk; ``made_ahead=False``
    deletes it: the crash came before it was made.

    The one way tests simulate a process crash of a ``DurableQueue``; the queue refuses calls
    afterwards. Reopen the directory with a new queue to recover it.
    """
    if q._sweeper is not None:
        q._sweeper.cancel()
    store = q._store
    # Jobs the sync thread took up ran before the crash (a real one may cut them short: what
    # that leaves, rules 1 and 2 cover); the next segment, made ahead, stays on disk.
    store.wait_for_syncs()
    spare = store.spare_number
    store._next.drop()
    if spare is not None and not made_ahead:
        os.unlink(os.path.join(store.dirpath, log_name(spare)))
    for segment in store._segments.values():
        segment.close()  # munmap + close: no msync (the page cache keeps the bytes)
    store._segments.clear()
    store._index.close()  # close(2) only, no fsync
    store._lock.drop()  # the kernel drops the flock with the last descriptor
    q._closed = True


def index_path(dirpath):
    (path,) = sorted(glob.glob(os.path.join(dirpath, "*.index")))[-1:]
    return path


def open_queue(dirpath, **kw):
    kw.setdefault("fsync", "never")
    return DurableQueue(0, str(dirpath), **kw)
