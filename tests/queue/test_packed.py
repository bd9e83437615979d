"""Packed put groups (one pickle of many messages' payloads): encoded by the client, kept
opaque by a memory queue, cut into leases, retried, moved and dead-lettered by their index
range; refused by a durable queue. The queue actors run on an event loop of the test's own
(no cluster): what crosses an actor boundary is the same blobs."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from daskqueue import DurableQueue, TransientQueue
from daskqueue.errors import PackedGroupRefusedError, PayloadTooLargeError, SerializationError
from daskqueue.messages import Kind
from daskqueue.metrics import payload_bytes
from daskqueue.queue.core import Span
from daskqueue.queue.encode import LazyBatches, PutOptions, encode_calls, encode_payloads, pack_bound
from daskqueue.queue.payload import ChunkPayload, delivery_segment, detach_payload, moved_group
from daskqueue.results import dead_letter_of
from daskqueue.serialize import dead_rows
from daskqueue.serialize import (
    PACK_MAX_BYTES,
    PACK_MAX_MESSAGES,
    decode_delivery,
    decode_put,
    encode_put,
    encode_settle,
    pickle_function,
)
from tests import tasks

pytestmark = pytest.mark.timeout(60)

LIMIT = 2**20


def map_batches(items, *, size=10_000, pack=True, lazy=False):
    """What ``map(tasks.double, items)`` encodes (one-argument calls)."""
    return encode_payloads(items, None, kind=Kind.CALL, function=pickle_function(tasks.double), options=PutOptions(),
                           size=size, limit=LIMIT, what="argument", one_argument=True,
                           pack_max_bytes=PACK_MAX_BYTES if pack else 0, lazy=lazy)


def args_batches(tasks_, *, size=10_000):
    """What ``batch_submit(tasks_)`` of one function encodes (argument tuples)."""
    return encode_calls([(t[0], tuple(t[1:]), None) for t in tasks_], PutOptions(), size=size, limit=LIMIT,
                        pack_max_bytes=PACK_MAX_BYTES)


def blob_of(batch):
    return encode_put(batch.groups, batch.funcs)


def run(coro):
    return asyncio.run(coro)


async def lease(q, n):
    """``(lease_id, [(seq, payload, attempts)])`` of a ``get_batch(n)``."""
    blob = await q.get_batch(n, 0.0)
    assert blob is not None
    lease_id, _, segments = decode_delivery(blob)
    return lease_id, [(s.first_seq + j, v, s.attempts) for s in segments for j, v in enumerate(s.values())]


async def settle(q, lease_id, n, errors=()):
    failed = {p: pickle.dumps(("builtins.ValueError", "no", "")) for p in errors}
    return await q.settle(lease_id, encode_settle(n, failed, set(), pickle.dumps([None] * n)))


# -- encoding ------------------------------------------------------------------------------------


def test_map_arguments_pack_into_groups_of_at_most_the_bound_and_round_trip():
    (batch,) = map_batches(list(range(2500)))
    assert [(g.count, g.packed, g.first, g.offsets) for g in batch.groups] == [
        (1000, 1000, 0, b""), (1000, 1000, 0, b""), (500, 500, 0, b"")]
    assert batch.positions == [range(0, 1000), range(1000, 2000), range(2000, 2500)]
    _, groups = decode_put(blob_of(batch))
    assert groups == batch.groups
    # The put's pickle, then a delivery of a whole group: the arguments, as payloads.
    chunk = _chunk(groups[1])
    seg = delivery_segment(Span(chunk, 0, 1000))
    assert seg.packed == 1000 and seg.values() == [(i,) for i in range(1000, 2000)]
    assert seg.unpacked() == (list(range(1000, 2000)), True)
    assert [pickle.loads(p) for p in seg.payloads()][:2] == [(1000,), (1001,)]  # one pickle each, if asked


def test_argument_tuples_pack_too_and_objects_shared_by_messages_stay_shared_in_a_group():
    shared = {"config": 1}
    (batch,) = args_batches([(tasks.add, i, shared) for i in range(5)])
    (group,) = batch.groups
    assert group.packed == 5
    values = delivery_segment(Span(_chunk(group), 0, 5)).values()
    assert [v[0] for v in values] == [0, 1, 2, 3, 4]
    assert values[0][1] == shared and values[0][1] is values[4][1]  # pickled once per group


def test_durable_pools_keyed_and_single_submissions_are_not_packed():
    options = PutOptions()
    assert pack_bound(100, options, LIMIT, durable=False) == PACK_MAX_BYTES
    assert pack_bound(100, options, 1000, durable=False) == 1000  # no packed blob over the limit
    assert pack_bound(100, options, LIMIT, durable=True) == 0
    assert pack_bound(100, PutOptions(key="k"), LIMIT, durable=False) == 0
    assert pack_bound(1, options, LIMIT, durable=False) == 0
    (batch,) = map_batches(list(range(10)), pack=False)
    (group,) = batch.groups
    assert group.packed == 0 and group.count == 10 and len(group.offsets) == 4 * 11


def test_an_unpicklable_argument_in_a_packed_group_is_named_by_its_index():
    items = list(range(3000))
    items[2345] = tasks.Unpicklable()
    with pytest.raises(SerializationError, match="task 2345") as info:
        map_batches(items, size=1000)
    assert info.value.index == 2345
    calls = [(tasks.add, i, 1) for i in range(50)]
    calls[37] = (tasks.add, tasks.Unpicklable(), 1)
    with pytest.raises(SerializationError, match="task 37") as info:
        args_batches(calls)
    assert info.value.index == 37


def test_an_argument_only_cloudpickle_can_pickle_ends_packing_and_still_runs():
    items = [1, 2, lambda: 3, 4]
    (batch,) = map_batches(items)
    (group,) = batch.groups
    assert group.packed == 0 and group.count == 4
    values = delivery_segment(Span(_chunk(group), 0, 4)).values()
    assert values[0] == (1,) and values[2][0]() == 3


def test_a_mix_of_big_and_small_arguments_packs_the_small_ones_and_keeps_each_big_one_whole():
    bigs = [bytes([k]) * (PACK_MAX_BYTES // 3) for k in range(4)]  # distinct: pickle keeps a repeated one once
    items = list(range(600)) + bigs + list(range(600, 3000))
    (batch,) = map_batches(items)
    packed = [(g.count, g.packed) for g in batch.groups]
    assert any(p == 0 for _, p in packed) and any(p > 0 for _, p in packed)
    assert sum(g.count for g in batch.groups) == len(items)
    assert all(len(g.data) <= PACK_MAX_BYTES for g in batch.groups if g.packed)
    out = []
    for g, positions in zip(batch.groups, batch.positions):
        seg = delivery_segment(Span(_chunk(g), 0, g.count))
        out += [(p, v) for p, v in zip(positions, seg.values())]
    assert [p for p, _ in out] == list(range(len(items)))
    assert [v for _, v in out] == [(x,) for x in items]
    # A single argument over the message limit is still refused, by index.
    with pytest.raises(PayloadTooLargeError) as info:
        encode_payloads(list(range(100)) + [b"y" * (LIMIT + 1)], None, kind=Kind.CALL, function=None,
                        options=PutOptions(), size=10_000, limit=LIMIT, what="argument", one_argument=True,
                        pack_max_bytes=PACK_MAX_BYTES)
    assert info.value.index == 100


def test_lazy_batches_encode_as_they_are_iterated_and_stop_at_a_bad_argument():
    items = list(range(5000))
    items[3500] = tasks.Unpicklable()
    batches = map_batches(items, size=1000, lazy=True)
    assert isinstance(batches, LazyBatches) and len(batches) == 5
    batches.first()
    sent = list(batches)
    assert len(sent) == 3 and batches.encoded == 3000
    with pytest.raises(SerializationError, match="task 3500"):
        batches.raise_error()
    items[3500] = 3500
    items[10] = tasks.Unpicklable()
    with pytest.raises(SerializationError, match="task 10"):  # the first batch: raised before any is sent
        map_batches(items, size=1000, lazy=True).first()


# -- the queue --------------------------------------------------------------------------------------


def test_leases_split_a_packed_chunk_and_each_carries_its_own_index_range():
    async def main():
        q = TransientQueue(0)
        (batch,) = map_batches(list(range(10)))
        assert await q.put_batch(blob_of(batch)) == [(0, 10)]
        got = []
        for n in (3, 4, 10):
            lease_id, items = await lease(q, n)
            got += items
            assert (await settle(q, lease_id, len(items)))[0] == len(items)
        assert got == [(i, (i,), 0) for i in range(10)]
        assert (await q.stats()).total_acked == 10
        await q.close()

    run(main())


def test_failed_messages_of_a_packed_chunk_are_redelivered_alone():
    async def main():
        q = TransientQueue(0, retry_backoff_base_s=0.0, retry_backoff_max_s=0.0, retry_backoff_jitter=0.0)
        (batch,) = map_batches(list(range(100, 110)))
        await q.put_batch(blob_of(batch))
        lease_id, items = await lease(q, 10)
        assert len(items) == 10
        assert (await settle(q, lease_id, 10, errors=(2, 7)))[:2] == (8, 2)
        for _ in range(100):  # the sweeper makes them ready again
            blob = await q.get_batch(10, 0.05)
            if blob is not None:
                break
        lease_id, _, segments = decode_delivery(blob)
        assert [(s.first_seq, s.count, s.first, s.attempts) for s in segments] == [(2, 1, 2, 1), (7, 1, 7, 1)]
        assert [v for s in segments for v in s.values()] == [(102,), (107,)]
        await settle(q, lease_id, 2)
        assert (await q.stats()).total_acked == 10
        await q.close()

    run(main())


def test_a_packed_dead_letter_shows_its_arguments_and_replays():
    async def main():
        q = TransientQueue(0, max_retries=0)
        (batch,) = map_batches(list(range(20, 30)))
        await q.put_batch(blob_of(batch))
        lease_id, _ = await lease(q, 10)
        await settle(q, lease_id, 10, errors=(4,))
        (row,) = dead_rows(await q.dead_letters())
        assert row[0] == 4 and row[4] == Kind.CALL
        d = dead_letter_of(0, row, {row[5]: tasks.double})
        assert d.payload == (tasks.double, (24,), {})
        held = payload_bytes([(q._core.dead[0].chunk.payload, 0, 1)])  # noqa: SLF001
        assert 0 < held <= len(batch.groups[0].data)
        assert await q.replay_dead() == [(4, 1, 0, 10)]
        lease_id, items = await lease(q, 10)
        assert items == [(10, (24,), 0)]
        await settle(q, lease_id, 1)
        assert dead_rows(await q.dead_letters()) == []
        await q.close()

    run(main())


def test_a_move_keeps_the_blob_and_the_index_range():
    (batch,) = map_batches(list(range(50)))
    (group,) = batch.groups
    chunk = _chunk(group)
    moved = moved_group(Span(chunk, 10, 25), 0.0)
    assert (moved.count, moved.packed, moved.first) == (15, 50, 10) and moved.data is group.data
    # Moved again (a part of the moved part): the index range is in the original blob.
    again = moved_group(Span(_chunk(moved), 5, 10), 0.0)
    assert (again.count, again.first) == (5, 15)
    _, (back,) = decode_put(encode_put([again], {}))
    assert delivery_segment(Span(_chunk(back), 0, 5)).values() == [(x,) for x in range(15, 20)]
    dead = detach_payload(chunk, 49)
    assert dead.packed == 50 and dead.first == 49 and pickle.loads(dead.message_bytes(0)) == (49,)
    # Two parts of one blob in one put carry it once.
    (wide,) = map_batches([str(i) * 500 for i in range(50)])
    wide_chunk = _chunk(wide.groups[0])
    two = encode_put([moved_group(Span(wide_chunk, 0, 10), 0.0), moved_group(Span(wide_chunk, 30, 40), 0.0)], {})
    assert len(two) < len(wide.groups[0].data) + 1000


def test_a_moved_packed_part_runs_from_the_queue_it_moved_to():
    async def main():
        q = TransientQueue(1)
        (batch,) = map_batches(list(range(40)))
        moved = moved_group(Span(_chunk(batch.groups[0]), 30, 40), 0.0)
        assert await q.put_batch(encode_put([moved], batch.funcs)) == [(0, 10)]
        _, items = await lease(q, 100)
        assert [v for _, v, _ in items] == [(x,) for x in range(30, 40)]
        assert (await q.stats()).total_put == 10
        await q.close()

    run(main())


def test_a_durable_queue_refuses_a_packed_group_and_stores_nothing(tmp_path):
    async def main():
        q = DurableQueue(0, str(tmp_path / "q"))
        (batch,) = map_batches(list(range(10)))
        with pytest.raises(PackedGroupRefusedError):
            await q.put_batch(blob_of(batch))
        assert (await q.stats()).total_put == 0
        (plain,) = map_batches(list(range(10)), pack=False)
        assert await q.put_batch(blob_of(plain)) == [(0, 10)]
        await q.close()

    run(main())


def test_a_packed_blob_over_the_queues_message_limit_is_refused():
    async def main():
        q = TransientQueue(0, max_message_bytes=1000)
        (batch,) = map_batches([bytes([k]) * 100 for k in range(50)])
        assert len(batch.groups[0].data) > 1000
        with pytest.raises(PayloadTooLargeError):
            await q.put_batch(blob_of(batch))
        await q.close()

    run(main())


def test_metrics_count_a_share_of_a_packed_blob_per_message():
    (batch,) = map_batches(list(range(PACK_MAX_MESSAGES)))
    payload = _chunk(batch.groups[0]).payload
    whole = payload_bytes([(payload, 0, PACK_MAX_MESSAGES)])
    assert whole == len(batch.groups[0].data)
    assert payload_bytes([(payload, 0, PACK_MAX_MESSAGES // 2)]) == whole // 2


def _chunk(group):
    """A chunk holding ``group`` as a queue stores it."""
    from daskqueue.queue.core import Chunk
    from daskqueue.queue.payload import packed_payload

    if group.packed:
        payload = packed_payload(group.data, group.packed, group.first)
    else:
        from array import array

        offsets = array("I")
        offsets.frombytes(group.offsets)
        payload = ChunkPayload(offsets, group.data)
    return Chunk(0, group.count, group.priority, payload, group.meta(), True, group.type, group.key)


def test_a_listing_of_many_packed_dead_letters_carries_their_blob_once():
    """Review finding 6: each row was its own pickle holding the whole group's blob, so
    1,000 dead letters of one packed group listed ~1,000 copies of it."""
    async def main():
        q = TransientQueue(0, max_retries=0)
        (batch,) = map_batches(["x" * 200 + str(i) for i in range(200)])
        await q.put_batch(blob_of(batch))
        lease_id, _ = await lease(q, 200)
        await settle(q, lease_id, 200, errors=tuple(range(200)))
        answer = await q.dead_letters()
        assert len(pickle.dumps(answer)) < 2 * len(batch.groups[0].data)  # one blob on the wire, not 200
        blobs: dict = {}
        letters = [dead_letter_of(0, row, {row[5]: tasks.double}, blobs) for row in dead_rows(answer)]
        assert [d.payload[1] for d in letters] == [("x" * 200 + str(i),) for i in range(200)]
        await q.close()

    asyncio.run(main())
