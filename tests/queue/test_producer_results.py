"""Outcomes per producer, queue side: the pure parts (no Dask), then the contract on real
queue actors (transient and durable, a durable one reopened)."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from daskqueue import DurableQueue, TransientQueue
from daskqueue.messages import Kind
from daskqueue.consumer.batch import Outcome, dump_results
from daskqueue.queue.producer_results import ProducerBook, segment_producers, split_by_producer
from daskqueue.segment.format import CHUNK_HEADER, ChunkHeader
from daskqueue.serialize import (Group, ResultRecord, decode_delivery, decode_records, encode_put, encode_settle,
                                 pack_payloads)

# -- pure -------------------------------------------------------------------------------------


class _Span:
    def __init__(self, first_seq, producer):
        self.first_seq = first_seq
        self.chunk = type("C", (), {"meta": type("M", (), {"producer": producer})()})()


@pytest.mark.timeout(10)
def test_a_record_of_one_producer_is_kept_whole_and_tagged():
    record = ResultRecord(0, [(0, 2), (5, 1)], [1], pickle.dumps(["a", None, "c"]), None, 3)
    (only,) = split_by_producer(record, [7, 7])
    assert only.producer == 7 and only.ranges == record.ranges and only.results == record.results
    assert split_by_producer(record, [0, 0]) == [record]  # the owner's record keeps its old layout
    assert len(record) == 6


@pytest.mark.timeout(10)
def test_a_record_of_mixed_producers_is_cut_by_range_with_failures_and_final_errors():
    cut = {0: pickle.dumps(["a", "b", "d"]), 9: pickle.dumps([None])}
    record = ResultRecord(1, [(0, 2), (10, 1), (2, 1)], [2], cut, {2: b"err"}, None)
    pieces = {getattr(p, "producer", 0): p for p in split_by_producer(record, [0, 9, 0])}
    owner, other = pieces[0], pieces[9]
    assert owner.ranges == [(0, 2), (2, 1)] and pickle.loads(owner.results) == ["a", "b", "d"]
    assert owner.failed == [] and owner.final_errors is None
    assert other.ranges == [(10, 1)] and pickle.loads(other.results) == [None]
    assert other.failed == [0] and other.final_errors == {0: b"err"}


@pytest.mark.timeout(10)
def test_the_consumer_cuts_results_by_producer_and_the_queue_never_unpickles_them():
    segs = [type("S", (), {"producer": p, "count": n})() for p, n in [(0, 2), (9, 1), (0, 1)]]
    assert segment_producers(segs[:1]) is None  # one producer: one list, as before
    outcome = Outcome(3, {}, set(), ["a", "b", "x"], producers=segment_producers(segs))  # stopped after 3
    cut = dump_results(outcome)
    assert {p: pickle.loads(b) for p, b in cut.items()} == {0: ["a", "b"], 9: ["x"]}
    # A single list for mixed producers (it cannot be cut without unpickling user data, here
    # bytes that do not unpickle at all) goes whole to the first producer, never raising.
    record = ResultRecord(0, [(0, 1), (5, 1)], [], b"not a pickle", None, None)
    (whole,) = split_by_producer(record, [0, 9])
    assert whole.results == b"not a pickle" and whole.ranges == record.ranges


@pytest.mark.timeout(10)
def test_a_chunk_header_carries_a_producer_tag_behind_its_flag_and_older_headers_read_as_the_owner():
    tagged = ChunkHeader(5, 2, 0, Kind.CALL, b"d" * 16, "t", "k", 0.0, 0.0, 123456)
    data = tagged.to_bytes()
    assert ChunkHeader.from_bytes(data + b"rest") == (tagged, len(data))
    assert len(data) == ChunkHeader.encoded_size("t", "k", 123456)
    owner = ChunkHeader(5, 2, 0, Kind.CALL, None, None, None, 0.0)
    assert len(owner.to_bytes()) == CHUNK_HEADER.size  # the owner's layout is the old one
    assert ChunkHeader.from_bytes(owner.to_bytes())[0].producer == 0


# -- queue actors -----------------------------------------------------------------------------


@pytest.fixture(params=[TransientQueue, DurableQueue], ids=lambda k: k.kind)
def make_queue(request, client, tmp_path):
    made = []

    def make(path="q"):
        args = (0,) if request.param is TransientQueue else (0, str(tmp_path / path))
        future = client.submit(request.param, *args, actor=True, pure=False)
        queue = future.result()
        made.append(queue)
        return queue

    make.kind = request.param.kind
    yield make
    for queue in made:
        try:
            queue.close().result()
        except Exception:
            pass


def _put(queue, items, producer=0):
    offsets, data = pack_payloads(items, max_message_bytes=2**20)
    g = Group(Kind.RAW, None, None, 0, None, 0.0, len(items), offsets, data)
    return queue.put_batch(encode_put([g], {}), None, producer).result()


def _run_all(queue, n):
    """Lease every ready message (one lease), ack them with their items as results; return
    the producers the delivery named."""
    blob = queue.get_batch(n, 0.0).result()
    lease_id, _, segments = decode_delivery(blob)
    items = [pickle.loads(p) for s in segments for p in s.payloads()]
    outcome = Outcome(len(items), {}, set(), items, producers=segment_producers(segments))
    queue.settle(lease_id, encode_settle(len(items), {}, set(), dump_results(outcome))).result()  # as a consumer
    return [s.producer for s in segments]


def _fetch(queue, cursor, producer):
    cursor, blob, _, _ = queue.fetch_outcomes(cursor, 0, 0.0, producer).result()
    return cursor, [v for r in decode_records(blob) for v in pickle.loads(r.results)]


@pytest.mark.timeout(30)
def test_each_producer_fetches_exactly_its_own_results_from_one_lease(make_queue):
    q = make_queue()
    _put(q, ["o1", "o2"])
    _put(q, ["a1"], producer=11)
    _put(q, ["b1", "b2"], producer=22)
    assert _run_all(q, 10) == [0, 11, 22]  # one lease across three producers' puts
    a_cursor, a = _fetch(q, 0, 11)
    assert a == ["a1"]
    owner_cursor, owner = _fetch(q, 0, 0)
    assert owner == ["o1", "o2"]
    assert _fetch(q, owner_cursor, 0)[1] == []  # fetched: gone for the owner
    assert _fetch(q, a_cursor, 11)[1] == []
    b_cursor, b = _fetch(q, 0, 22)
    assert b == ["b1", "b2"]
    q.forget_producer(22).result()
    assert _fetch(q, 0, 22)[1] == []


@pytest.mark.timeout(60)
def test_a_reopened_durable_queue_keeps_each_producers_messages_and_results(make_queue):
    if make_queue.kind != "durable":
        pytest.skip("transient queues do not reopen")
    q = make_queue("reopen")
    _put(q, ["a1"], producer=11)
    _put(q, ["o1"])
    assert _run_all(q, 10) == [11, 0]
    _put(q, ["a2"], producer=11)  # still waiting when the queue closes
    q.close().result()
    again = make_queue("reopen")
    assert _fetch(again, 0, 0)[1] == ["o1"]
    assert _fetch(again, 0, 11)[1] == ["a1"]
    assert _run_all(again, 10) == [11]  # the waiting message kept its producer on disk
    assert _fetch(again, 0, 11)[1] == ["a1", "a2"]


@pytest.mark.timeout(30)
def test_a_mixed_lease_with_results_the_queue_cannot_unpickle_still_settles(make_queue):
    q = make_queue()
    _put(q, ["o1"])
    _put(q, ["a1"], producer=11)
    lease_id, _, segments = decode_delivery(q.get_batch(10, 0.0).result())
    assert [s.producer for s in segments] == [0, 11]
    # Results a queue could not unpickle (a class only the workers' tasks know, say): the
    # consumer's cut per producer is stored as it is.
    cut = {0: b"\x80\x05opaque-owner", 11: b"\x80\x05opaque-11"}
    assert q.settle(lease_id, encode_settle(2, {}, set(), cut)).result()[0] == 2
    _, blob, _, _ = q.fetch_outcomes(0, 0, 0.0, 11).result()
    (record,) = decode_records(blob)
    assert record.results == b"\x80\x05opaque-11" and record.ranges == [(segments[1].first_seq, 1)]


@pytest.mark.timeout(30)
def test_early_acked_outcomes_go_to_the_producer_the_consumer_names_even_after_a_reopen(make_queue):
    q = make_queue("early")
    _put(q, ["a1"], producer=11)
    lease_id, _, segments = decode_delivery(q.get_batch(10, 0.0).result())
    q.settle(lease_id, encode_settle(1, {}, set(), None)).result()  # acked early, before it ran
    if make_queue.kind == "durable":  # the queue keeps no note of whose they were
        q.close().result()
        q = make_queue("early")
    q.record_outcomes([(segments[0].first_seq, 1)], {}, pickle.dumps(["r1"]), None, [11]).result()
    assert _fetch(q, 0, 11)[1] == ["r1"]
    assert _fetch(q, 0, 0)[1] == []


# -- a producer that is gone (in-process queue: no Dask needed for the outbox's bookkeeping) ---


async def _put_here(q, items, producer=0):
    offsets, data = pack_payloads(items, max_message_bytes=2**20)
    g = Group(Kind.RAW, None, None, 0, None, 0.0, len(items), offsets, data)
    return await q.put_batch(encode_put([g], {}), None, producer)


async def _run_here(q):
    lease_id, _, segments = decode_delivery(await q.get_batch(100, 0.0))
    items = [pickle.loads(p) for s in segments for p in s.payloads()]
    outcome = Outcome(len(items), {}, set(), items, producers=segment_producers(segments))
    await q.settle(lease_id, encode_settle(len(items), {}, set(), dump_results(outcome)))


@pytest.mark.timeout(30)
def test_a_gone_producers_records_hold_back_nobody_and_go_after_the_liveness_window():
    async def main():
        q = TransientQueue(0)
        await _put_here(q, ["a"], producer=11)  # a producer that never fetches (crashed)
        await _run_here(q)
        cursor = 0
        for i in range(50):
            await _put_here(q, [i])
            await _run_here(q)
            cursor, _, _, _ = await q.fetch_outcomes(cursor, 0, 0.0, 0)
        held = [r for r in q._results if r.ranges]
        # Only producer 11's record and the owner's last (fetched, dropped at its next fetch).
        assert len(held) <= 2 and sum(len(pickle.loads(r.results)) for r in held) <= 2
        q._producers.liveness_s = 0.0  # producer 11's window ran out
        await q.fetch_outcomes(cursor, 0, 0.0, 0)
        assert len(q._results) == 0
        await _put_here(q, ["late"], producer=22)
        await _run_here(q)
        await q.forget_producer(22)  # closed: its late records go too
        await q.fetch_outcomes(cursor, 0, 0.0, 0)
        assert not [r for r in q._results if r.ranges]
        await q.close()

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_the_producer_book_expires_attached_producers_never_the_owner_and_survives_hand_off():
    book = ProducerBook(liveness_s=60.0)
    book.hear(0, 0.0)
    book.hear(5, 0.0)
    book.notice(6, 30.0)
    book.fetched(5, 10)
    assert book.expire(61.0) == [5]
    assert book.wanted(ResultRecord(0, [(0, 1)], [], b"", None).tagged(6), 0)
    assert not book.wanted(ResultRecord(0, [(0, 1)], [], b"", None).tagged(5), 11)  # forgotten
    again = ProducerBook(liveness_s=60.0)
    again.load(book.export(now=70.0), now=1000.0)  # another process's clock
    assert again.forgotten == {5: None} and again.cursors == {}
    assert again.expire(1015.0) == [] and again.expire(1021.0) == [6]  # 40 s old at the hand-off
    assert again.hear(5, 1050.0)  # back after being forgotten: said so


@pytest.mark.timeout(10)
def test_a_message_of_exactly_the_limit_from_an_attached_producer_fits_one_segment():
    from daskqueue import defaults
    from daskqueue.queue.config import PoolConfig
    from daskqueue.segment.format import FILE_HEADER, LOG_RECORD_HEADER, PAYLOAD_OFFSET

    config = PoolConfig(durability="durable", dirpath="/tmp/unused", max_segment_bytes=defaults.MIN_SEGMENT_BYTES,
                        max_message_bytes=defaults.MIN_SEGMENT_BYTES)
    limit = config.message_limit("t", "k")
    record = (FILE_HEADER.size + LOG_RECORD_HEADER.size + ChunkHeader.encoded_size("t", "k", 2**31 - 1)
              + 2 * PAYLOAD_OFFSET.size + limit)
    assert record <= config.max_segment_bytes


def test_a_moved_record_is_a_tagged_record_its_producer_reads_and_a_durable_queue_stores_as_any():
    from daskqueue.queue.producer_results import is_moved_record, moved_record, moved_runs
    from daskqueue.serialize import ResultRecord

    record = moved_record(2, 77, [(10, 5, 0, 100), (40, 2, 1, 105)])
    assert record.producer == 77 and record.ranges == [(100, 5), (105, 2)]
    assert is_moved_record(record) and moved_runs(record) == [(10, 5, 0, 100), (40, 2, 1, 105)]
    again = ResultRecord.from_bytes(record.to_bytes())  # as a durable queue stores it
    assert is_moved_record(again) and again.producer == 77 and moved_runs(again) == moved_runs(record)
    book = ProducerBook()
    assert book.wanted(record, 0)


def test_adopted_runs_give_the_id_a_moved_message_was_given():
    from daskqueue.queue.producer_results import AdoptedRuns

    runs = AdoptedRuns(kept=2)
    runs.add(100, 5, 0, 10)
    runs.add(200, 3, 1, 40)
    assert runs.given(2, 102) == (0, 12) and runs.given(2, 201) == (1, 41)
    assert runs.given(2, 105) == (2, 105)  # not adopted: its own id
    runs.add(300, 1, 0, 7)  # bounded: the oldest run goes
    assert len(runs) == 2 and runs.given(2, 100) == (2, 100)


def test_moved_ids_keep_a_run_read_twice_once():
    from daskqueue.moved import MovedIds

    moves = MovedIds()
    moves.add([(10, 5, 2, 100)], 0)
    moves.add([(10, 5, 2, 100)], 0)  # the same moved record, fetched again
    assert len(moves) == 1
    assert moves.pieces(2, 100, 5, settle=True) == [(0, 10, 5, 0)]
    assert not moves  # every outcome of the run arrived: forgotten
