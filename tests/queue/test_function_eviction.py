"""Task functions are evicted: a service sending a new function per request (``submit(lambda:
...)``) does not grow the queue's, the consumer's or the child's function table, nor a
durable queue's disk, without end.

Queue-level tests drive real ``TransientQueue``/``DurableQueue`` objects with asyncio (fake
pickles: a queue never unpickles a function); the pool tests run on the session cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import pickle

import pytest

from daskqueue import defaults
from daskqueue.consumer.general import GeneralConsumer
from daskqueue.consumer.batch import Batch
from daskqueue.consumer.isolate import ChildFunctions
from daskqueue.errors import UnknownFunctionsError
from daskqueue.messages import Kind
from daskqueue.queue.functions import FunctionTable
from daskqueue.queue.transient import TransientQueue
from daskqueue.serialize import Group, decode_delivery, encode_put, encode_settle, pack_payloads, pickle_function
from tests.segment.helpers import open_queue


def digest_of(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def call_blob(funcs: dict[bytes, bytes], digests: list[bytes], carry: bool = True) -> bytes:
    """One put: one CALL message (argument 1) per digest; with ``carry`` its functions too."""
    offsets, data = pack_payloads([(1,)], max_message_bytes=1024)
    groups = [Group(Kind.CALL, d, None, 0, None, 0.0, 1, offsets, data) for d in digests]
    return encode_put(groups, {d: funcs[d] for d in digests} if carry else {})


def distinct_functions(n: int, filler: bytes) -> dict[bytes, bytes]:
    """``n`` distinct fake pickled functions (digest -> bytes) of about ``len(filler)`` bytes."""
    return {digest_of(b"%d" % i + filler): b"%d" % i + filler for i in range(n)}


async def put_and_run(q, funcs: dict[bytes, bytes], *, per_put: int, keep_last: bool = False,
                      housekeeping: bool = False) -> None:
    """Put one call per function, ``per_put`` to a put, running each put's calls before the
    next (``keep_last``: the last put's stay ready; ``housekeeping``: the queue's after each)."""
    digests = list(funcs)
    for start in range(0, len(digests), per_put):
        await q.put_batch(call_blob(funcs, digests[start:start + per_put]))
        if keep_last and start + per_put >= len(digests):
            return
        await run_all(q)
        if housekeeping:
            await q._housekeeping()  # noqa: SLF001


async def run_all(q, *, fail: bool = False) -> int:
    """Lease and settle everything ready (``fail``: as failed, fatally); return how many."""
    n = 0
    while True:
        blob = await q.get_batch(1000, 0.0)
        if blob is None:
            return n
        lease_id, _, segments = decode_delivery(blob)
        count = sum(s.count for s in segments)
        errors = {i: b"boom" for i in range(count)} if fail else {}
        await q.settle(lease_id, encode_settle(count, errors, set(errors), pickle.dumps([None] * count)))
        n += count


# -- the pure table ---------------------------------------------------------------------------------


def test_table_sweeps_unused_functions_into_a_bounded_idle_table():
    table = FunctionTable(sweep_min=4, idle_max=2)
    table.add({bytes([i]) * 16: b"f%d" % i for i in range(10)})
    assert table.sweep_due()
    dropped = table.sweep({bytes([0]) * 16})
    assert len(dropped) == 9 and list(table.held) == [bytes([0]) * 16]
    assert table.idle_count == 2  # the newest two swept
    assert table.get(bytes([9]) * 16) == b"f9" and bytes([1]) * 16 not in table
    new, unknown = table.to_store([bytes([9]) * 16, bytes([1]) * 16], {})
    assert new == {bytes([9]) * 16: b"f9"} and unknown == [bytes([1]) * 16]
    assert not table.sweep_due()  # one held: not past sweep_min


def test_child_functions_tell_the_child_what_to_drop_never_the_batch_own():
    sent = ChildFunctions(max_entries=3)
    funcs = {bytes([i]): b"x" for i in range(6)}
    needed, drop = sent.plan({bytes([0]), bytes([1]), bytes([2])}, funcs)
    assert len(needed) == 3 and drop == []
    needed, drop = sent.plan({bytes([3]), bytes([4])}, funcs)
    assert set(needed) == {bytes([3]), bytes([4])} and len(drop) == 2 and len(sent) == 3
    assert bytes([3]) in sent and bytes([4]) in sent
    needed, drop = sent.plan({bytes([3])}, funcs)  # held: nothing sent again
    assert needed == {} and drop == []


# -- the queue actor ------------------------------------------------------------------------------


def test_put_naming_a_function_the_queue_does_not_hold_is_refused_before_storing():
    async def main():
        q = TransientQueue(0)
        f = b"function-f"
        with pytest.raises(UnknownFunctionsError) as e:
            await q.put_batch(call_blob({digest_of(f): f}, [digest_of(f)], carry=False), b"t" * 16)
        assert e.value.digests == [digest_of(f)]
        assert (await q.stats()).total_put == 0
        # The same put again, same token, carrying the function: stored once.
        await q.put_batch(call_blob({digest_of(f): f}, [digest_of(f)]), b"t" * 16)
        assert (await q.stats()).total_put == 1
        assert await q.get_functions([digest_of(f)]) == {digest_of(f): f}
        await q.close()

    asyncio.run(main())


def test_queue_keeps_only_the_functions_its_messages_and_dead_letters_use():
    async def main():
        q = TransientQueue(0, max_retries=0)
        funcs = {digest_of(b"f%d" % i): b"f%d" % i for i in range(5000)}
        digests = list(funcs)
        dead_one, live_one = digests[0], digests[1]
        await q.put_batch(call_blob(funcs, [dead_one]))
        assert await run_all(q, fail=True) == 1  # a dead letter keeps its function
        await q.put_batch(call_blob(funcs, [live_one]))  # stays ready throughout
        blob = await q.get_batch(1, 0.0)  # ...leased, in fact
        assert blob is not None
        for start in range(2, len(digests), 100):
            await q.put_batch(call_blob(funcs, digests[start:start + 100]))
            await run_all(q)
        await q._housekeeping()  # the sweeper's turn  # noqa: SLF001
        s = await q.stats()
        assert s.functions <= 2 * defaults.QUEUE_FUNCTION_SWEEP_MIN + 100
        assert s.idle_functions <= defaults.QUEUE_IDLE_FUNCTIONS
        assert await q.get_functions([dead_one, live_one]) == {dead_one: funcs[dead_one], live_one: funcs[live_one]}
        # An evicted function, named again without being carried: refused; carried: fine.
        with pytest.raises(UnknownFunctionsError):
            await q.put_batch(call_blob(funcs, [digests[2]], carry=False))
        await q.put_batch(call_blob(funcs, [digests[2]]))
        # A recently swept one is still idle: named without being carried, it comes back.
        await q.put_batch(call_blob(funcs, [digests[-1]], carry=False))
        await q.close()

    asyncio.run(main())


def test_durable_compaction_deletes_the_segments_of_dropped_functions(tmp_path):
    async def main():
        q = open_queue(tmp_path / "q", max_segment_bytes=64 * 1024, compact_index_bytes=2**30)
        big = distinct_functions(600, b"x" * 8000)
        digests = list(big)
        live_one = digests[-1]
        await put_and_run(q, big, per_put=20, keep_last=True)
        before = await q.disk_usage()
        await q.compact()
        after = await q.disk_usage()
        assert after["disk_bytes"] < before["disk_bytes"] / 3, (before, after)
        await q.close()
        # Reopened: nothing reported corrupt, the live message's function is there.
        q = open_queue(tmp_path / "q", max_segment_bytes=64 * 1024)
        report = await q.recovery_report()
        assert report["corruptions"] == [] and report["messages"] == 20
        assert live_one in await q.get_functions([live_one])
        await q.close()

    asyncio.run(main())


def test_durable_reopen_before_compaction_reports_no_corruption(tmp_path):
    """Swept FUNC records stay pinned until a compaction drops them from the index."""
    async def main():
        q = open_queue(tmp_path / "q", max_segment_bytes=16 * 1024, compact_index_bytes=2**30)
        big = distinct_functions(3000, b"y" * 2000)
        digests = list(big)
        await put_and_run(q, big, per_put=50, housekeeping=True)
        assert (await q.stats()).functions < len(digests)  # swept
        assert digests[0] not in await q.get_functions([digests[0]])  # and gone from the idle table
        await q.put_batch(call_blob(big, [digests[0]]))  # sent again before any compaction
        await q.close()
        for _ in range(2):  # the first reopen's sync deletes what it left unpinned
            q = open_queue(tmp_path / "q", max_segment_bytes=16 * 1024)
            assert (await q.recovery_report())["corruptions"] == []
            assert (await q.stats()).functions == 1  # the reopen swept all but the one in use
            assert digests[0] in await q.get_functions([digests[0]])
            await q.close()

    asyncio.run(main())


# -- the consumer ---------------------------------------------------------------------------------


def test_a_batch_whose_function_was_evicted_before_it_ran_still_runs():
    async def main():
        q = TransientQueue(0)
        pickled = pickle_function(lambda x: 3 * x)
        offsets, data = pack_payloads([(7,), (8,)], max_message_bytes=1024)
        await q.put_batch(encode_put([Group(Kind.CALL, pickled.digest, None, 0, None, 0.0, 2, offsets, data)],
                                     {pickled.digest: pickled.data}))
        lease_id, queue_index, segments = decode_delivery(await q.get_batch(10, 0.0))
        await q.close()
        return Batch(0, queue_index, lease_id, segments, 2, funcs={pickled.digest: pickled.data})

    batch = asyncio.run(main())
    consumer = GeneralConsumer(0, [None], isolation="thread")
    # Its caches are empty, as after evicting the function between the fetch and the run.
    assert len(consumer._func_bytes) == 0  # noqa: SLF001
    outcome, _ = consumer._run_batch_safely(batch)  # noqa: SLF001
    assert outcome.errors == {} and outcome.results == [21, 24]
    # A subclass with its own process_item (the Message path) too.

    class Plain(GeneralConsumer):
        def process_item(self, message):
            return message.data()

    outcome, _ = Plain(0, [None], isolation="thread")._run_batch_safely(batch)  # noqa: SLF001
    assert outcome.errors == {} and outcome.results == [21, 24]


# -- through real pools --------------------------------------------------------------------------


def _constant(i):
    return lambda: i  # a closure per value: a distinct pickle, a distinct function


def test_ten_thousand_distinct_functions_leave_the_tables_bounded(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp)
    cp.start()
    rounds, per_round = 20, 500
    for r in range(rounds):
        ids = qp.batch_submit([(_constant(r * per_round + k),) for k in range(per_round)])
        cp.join(timeout=120)
        results = qp.results(clear=True)
        assert [results[i] for i in ids] == [r * per_round + k for k in range(per_round)]
    for s in qp.stats():
        assert s.functions <= 2 * defaults.QUEUE_FUNCTION_SWEEP_MIN + per_round, s
        assert s.idle_functions <= defaults.QUEUE_IDLE_FUNCTIONS, s
    children = 0
    for consumer in cp.consumers:
        counts = consumer.function_counts().result(timeout=30)
        assert max(counts.values()) <= defaults.CONSUMER_FUNCTION_CACHE_ENTRIES, counts
        children += counts["child"] > 0
    assert children  # a consumer beside a queue runs its tasks in a child process: bounded too


def test_a_client_that_believes_a_function_sent_resends_it(pools):
    qp = pools.queue(1)
    cp = pools.consumer(qp)
    cp.start()
    func = _constant(41)
    # As after the queue evicted it: the client remembers sending it, the queue lacks it.
    qp.table.sent_funcs[0].add(pickle_function(func).digest)
    task_id = qp.submit(func)
    assert qp.result(task_id, timeout_s=60) == 41
