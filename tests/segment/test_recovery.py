"""One test per recovery rule of FORMAT.md, on real files with byte surgery (no Dask)."""

from __future__ import annotations

import os
import time

import pytest

from daskqueue.errors import CorruptStoreError, FormatVersionError
from daskqueue.segment.format import FILE_HEADER, INDEX_RECORD, IndexRecord, IndexType, index_name, log_name
from daskqueue.segment.log import header_is_blank
from tests.segment.helpers import crash, drain, get, index_path, open_queue, put, settle

REC = INDEX_RECORD.size


async def _records(dirpath):
    with open(index_path(dirpath), "rb") as f:
        data = f.read()[FILE_HEADER.size :]
    return [IndexRecord.from_bytes(data[i : i + REC]) for i in range(0, len(data) - len(data) % REC, REC)]


def _dropped(rule, path, offset, size, reason):
    return {"rule": rule, "path": str(path), "offset": offset, "bytes_dropped": size, "reason": reason}


async def test_rule1_unfinished_compaction_is_discarded_and_newest_index_wins(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a", "b"])
    await q.compact()  # generation 2
    crash(q)
    (tmp_path / (index_name(3) + ".tmp")).write_bytes(b"half a compaction")
    (tmp_path / index_name(1)).write_bytes(b"an old generation left by a crash")
    q = open_queue(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.index*")) == [index_name(2)]
    assert [v for v, _ in (await drain(q)).values()] == ["a", "b"]


async def test_rule1_log_segments_without_an_index_are_refused_and_nothing_is_modified(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a", "b"])
    crash(q)
    os.unlink(index_path(tmp_path))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # Segment 2 is the one made ahead for the next rollover (segment/rotation.py).
    with pytest.raises(CorruptStoreError, match=f"{tmp_path}: log segments \\[1, 2\\] but no index"):
        open_queue(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


async def test_rule1_older_generations_are_kept_when_the_newest_index_is_refused(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a"])
    await q.compact()  # generation 2
    crash(q)
    (tmp_path / index_name(1)).write_bytes(b"an older generation")
    (tmp_path / (index_name(3) + ".tmp")).write_bytes(b"half a compaction")
    newest = tmp_path / index_name(2)
    newest.write_bytes(b"NOTOURS!" + newest.read_bytes()[8:])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(CorruptStoreError, match="wrong magic"):
        open_queue(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


async def test_rule1_files_whose_creation_a_crash_interrupted_are_discarded(tmp_path):
    q = open_queue(tmp_path, max_segment_bytes=65536)
    await put(q, ["a"])
    crash(q)
    (tmp_path / (log_name(2) + ".tmp")).write_bytes(bytes(FILE_HEADER.size))  # a rollover, cut short
    q = open_queue(tmp_path, max_segment_bytes=65536)
    assert sorted(p.name for p in tmp_path.glob("*.tmp")) == []
    await put(q, [b"x" * 40000, b"y" * 40000])  # rolls over into segment 2 after all
    crash(q)
    q = open_queue(tmp_path, max_segment_bytes=65536)
    assert [v for v, _ in (await drain(q)).values()] == ["a", b"x" * 40000, b"y" * 40000]


async def test_rule1_a_new_store_whose_first_index_was_cut_short_opens_empty(tmp_path):
    (tmp_path / "DASKQUEUE").write_bytes(b"daskqueue queue store\n")
    (tmp_path / (index_name(1) + ".tmp")).write_bytes(b"")  # crashed while creating it
    q = open_queue(tmp_path)
    await put(q, ["a"])
    crash(q)
    assert await drain(open_queue(tmp_path)) == {0: ("a", 0)}


async def test_rule2_blank_header_on_a_new_segment_no_index_record_names_is_deleted(tmp_path):
    q = open_queue(tmp_path, max_segment_bytes=65536)
    await put(q, ["a"])
    crash(q, made_ahead=False)
    # What creating segment 2 in place left when the crash came before its header was written.
    with open(tmp_path / log_name(2), "wb") as f:
        f.truncate(65536)
    q = open_queue(tmp_path, max_segment_bytes=65536)
    # The blank file went; segment 2 was made again (ahead of the next rollover), whole.
    assert q._store.segment_numbers() == [1] and q._store.spare_number == 2
    assert not header_is_blank(str(tmp_path / log_name(2)))
    assert await drain(q) == {0: ("a", 0)}


async def test_rule2_blank_header_on_a_segment_the_index_names_is_refused(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a"])
    crash(q, made_ahead=False)  # segment 1 is the newest
    seg = tmp_path / log_name(1)
    raw = bytearray(seg.read_bytes())
    raw[: FILE_HEADER.size] = bytes(FILE_HEADER.size)
    seg.write_bytes(raw)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(CorruptStoreError, match="index names"):
        open_queue(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


async def test_rule2_blank_first_index_of_a_store_without_segments_is_an_unfinished_creation(tmp_path):
    (tmp_path / "DASKQUEUE").write_bytes(b"daskqueue queue store\n")
    (tmp_path / index_name(1)).write_bytes(b"")  # created in place, a crash before its header
    q = open_queue(tmp_path)
    await put(q, ["a"])
    crash(q)
    assert await drain(open_queue(tmp_path)) == {0: ("a", 0)}


async def test_rule2_wrong_magic_is_refused_and_nothing_is_modified(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a"])
    crash(q)
    path = index_path(tmp_path)
    raw = bytearray(open(path, "rb").read())
    raw[0:8] = b"NOTOURS!"
    open(path, "wb").write(raw)
    with pytest.raises(CorruptStoreError, match="wrong magic"):
        open_queue(tmp_path)
    assert open(path, "rb").read() == bytes(raw)


async def test_rule2_newer_format_version_is_refused(tmp_path):
    from daskqueue.segment.format import LOG_MAGIC, pack_file_header

    q = open_queue(tmp_path)
    await put(q, ["a"])
    crash(q)
    seg = tmp_path / log_name(1)
    raw = bytearray(seg.read_bytes())
    raw[:16] = pack_file_header(LOG_MAGIC, version=2)
    seg.write_bytes(raw)
    with pytest.raises(FormatVersionError) as info:
        open_queue(tmp_path)
    assert info.value.version == 2 and info.value.supported == 1


async def test_rule3_record_cut_off_at_the_tail_is_a_torn_write_and_dropped(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a", "b"])
    lease, _ = await get(q)
    await settle(q, lease, 2)  # LEASE + ACK records
    crash(q)
    path = index_path(tmp_path)
    size = os.path.getsize(path)
    os.truncate(path, size - 17)  # the ACK record, cut in the middle
    q = open_queue(tmp_path)
    report = await q.recovery_report()
    assert report["corruptions"] == []  # a crash, not corruption
    assert report["dropped"] == [_dropped(3, path, size - REC, REC - 17, "torn write")]
    assert (os.path.getsize(path) - FILE_HEADER.size) % REC == 0  # no partial record left
    # The ACK was lost with the torn write: both messages come back (rule 6, one attempt more).
    assert await drain(q) == {0: ("a", 1), 1: ("b", 1)}


async def test_rule3_bad_checksum_in_the_last_record_is_a_torn_write(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a"])
    await put(q, ["b"])
    crash(q)
    path = index_path(tmp_path)
    raw = bytearray(open(path, "rb").read())
    raw[-3] ^= 0xFF  # inside the last CHUNK record
    open(path, "wb").write(raw)
    q = open_queue(tmp_path)
    report = await q.recovery_report()
    assert report["corruptions"] == []
    assert report["dropped"] == [_dropped(3, path, len(raw) - REC, REC, "torn write")]
    assert await drain(q) == {0: ("a", 0)}


async def test_rule4_zero_filled_space_ends_the_data(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a"])
    crash(q)
    path = index_path(tmp_path)
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(bytes(3 * REC + 5))
    q = open_queue(tmp_path)
    report = await q.recovery_report()
    assert report["corruptions"] == []
    assert report["dropped"] == [_dropped(4, path, size, 3 * REC + 5, "zero fill")]
    assert os.path.getsize(path) == size
    assert await drain(q) == {0: ("a", 0)}


async def test_rule5_checksum_mismatch_before_the_tail_is_reported_and_skipped(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a", "b"])  # record 0: CHUNK 0..1
    lease, _ = await get(q)  # record 1: LEASE
    await settle(q, lease, 2)  # record 2: ACK
    await put(q, ["c"])  # record 4 after RESULT: CHUNK 2
    crash(q)
    path = index_path(tmp_path)
    records = await _records(tmp_path)
    ack = next(i for i, r in enumerate(records) if r.type == IndexType.ACK)
    offset = FILE_HEADER.size + ack * REC
    raw = bytearray(open(path, "rb").read())
    raw[offset + 10] ^= 0x40
    open(path, "wb").write(raw)
    reported = []
    from daskqueue.segment.store import SegmentStore

    store = SegmentStore(str(tmp_path), on_corruption=reported.append)
    store.close()
    assert [(e.path, e.offset, e.bytes_dropped) for e in reported] == [(path, offset, REC)]
    q = open_queue(tmp_path)
    report = await q.recovery_report()
    assert len(report["corruptions"]) == 1 and f"offset {offset}" in report["corruptions"][0]
    assert report["dropped"] == [_dropped(5, path, offset, REC, "index record checksum mismatch")]
    # Without its ACK, a and b were still leased: back with one attempt more; c is intact.
    assert await drain(q) == {0: ("a", 1), 1: ("b", 1), 2: ("c", 0)}


async def test_rule5_corrupt_chunk_log_record_loses_only_its_own_messages(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["first"])
    await put(q, ["second", "third"])
    records = await _records(tmp_path)
    second = [r for r in records if r.type == IndexType.CHUNK][1]
    crash(q)
    seg = tmp_path / log_name(second.segment)
    raw = bytearray(seg.read_bytes())
    raw[second.offset + 40] ^= 0xFF
    seg.write_bytes(raw)
    q = open_queue(tmp_path)
    report = await q.recovery_report()
    assert report["lost_messages"] == 2
    assert f"offset {second.offset}" in report["corruptions"][0]
    assert await drain(q) == {0: ("first", 0)}


async def test_rule5_segments_outlive_an_open_that_reports_corruption_until_compaction(tmp_path):
    q = open_queue(tmp_path, max_segment_bytes=65536)
    await put(q, [b"x" * 40000])  # segment 1
    await put(q, [b"y" * 40000])  # segment 2
    first = [r for r in await _records(tmp_path) if r.type == IndexType.CHUNK][0]
    crash(q)
    seg = tmp_path / log_name(1)
    raw = bytearray(seg.read_bytes())
    raw[first.offset + 100] ^= 0xFF  # the only live record of segment 1 is damaged
    seg.write_bytes(raw)
    q = open_queue(tmp_path, max_segment_bytes=65536)
    assert (await q.recovery_report())["lost_messages"] == 1
    assert await drain(q) == {1: (b"y" * 40000, 0)}
    q._store.sync()
    assert seg.read_bytes() == raw  # still there for salvage
    await q.compact()
    assert not seg.exists()  # the compacted index no longer names it


async def test_rule5_a_long_run_of_garbage_records_is_one_report_and_replay_goes_on(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a"])
    await put(q, ["b"])
    crash(q)
    path = index_path(tmp_path)
    raw = open(path, "rb").read()
    garbage = bytes([0x55]) * (REC * 5000)  # replay was quadratic in such runs
    open(path, "wb").write(raw[:-REC] + garbage + raw[-REC:])
    q = open_queue(tmp_path)
    offset = len(raw) - REC
    assert (await q.recovery_report())["corruptions"] == [
        f"{path} at offset {offset}: index record checksum mismatch; {len(garbage)} bytes dropped"
    ]
    assert [v for v, _ in (await drain(q)).values()] == ["a", "b"]


async def test_rule6_leased_at_crash_comes_back_ready_with_one_more_attempt(tmp_path):
    q = open_queue(tmp_path, max_retries=1)
    await put(q, ["a", "b", "c"])
    await get(q, 2)  # a, b leased when the process dies
    crash(q)
    q = open_queue(tmp_path, max_retries=1)
    assert await drain(q) == {0: ("a", 1), 1: ("b", 1), 2: ("c", 0)}


async def test_rule6_leased_at_crash_past_max_retries_is_dead_lettered(tmp_path):
    q = open_queue(tmp_path, max_retries=0)
    await put(q, ["a"])
    await get(q)
    crash(q)
    q = open_queue(tmp_path, max_retries=0)
    assert await drain(q) == {}
    _, dead = await q.fetch_dead(0)
    assert [(seq, attempts) for seq, attempts, _, _ in dead] == [(0, 1)]
    crash(q)  # and the decision was persisted: a second recovery does not count it again
    q = open_queue(tmp_path, max_retries=0)
    _, dead = await q.fetch_dead(0)
    assert [(seq, attempts) for seq, attempts, _, _ in dead] == [(0, 1)]


async def test_rule7_acked_message_never_comes_back(tmp_path):
    q = open_queue(tmp_path)
    await put(q, list(range(100)))
    lease, items = await get(q, 60)
    await settle(q, lease, 60)
    crash(q)
    q = open_queue(tmp_path)
    assert sorted(await drain(q)) == list(range(60, 100))
    crash(q)
    q = open_queue(tmp_path)
    assert await drain(q) == {}


async def test_rule8_retried_message_keeps_attempts_and_delayed_put_keeps_its_time(tmp_path):
    q = open_queue(tmp_path, max_retries=5, retry_backoff_base_s=60)
    await put(q, ["fails"])
    await put(q, ["later"], delay_s=1.0)
    lease, _ = await get(q)
    await settle(q, lease, 1, errors={0: b"E\x00m\x00tb"})  # in a 60 s backoff
    crash(q)
    q = open_queue(tmp_path, max_retries=5)
    assert await drain(q) == {0: ("fails", 1)}  # the backoff is not kept; the attempt is
    time.sleep(1.1)  # the put's 1 s delay must pass: its kept not-before time is under test
    assert await drain(q) == {1: ("later", 0)}


async def test_rule9_unreferenced_bytes_after_the_append_point_are_overwritten(tmp_path):
    q = open_queue(tmp_path)
    await put(q, ["a"])
    records = await _records(tmp_path)
    end = q._store.active.end
    crash(q, made_ahead=False)  # segment 1 stays the active one
    seg = tmp_path / log_name(1)
    raw = bytearray(seg.read_bytes())
    raw[end : end + 64] = b"\xab" * 64  # a log append whose index record never got written
    seg.write_bytes(raw)
    q = open_queue(tmp_path)
    assert q._store.active.end == end
    await put(q, ["b"])
    crash(q)
    q = open_queue(tmp_path)
    assert await drain(q) == {0: ("a", 0), 1: ("b", 0)}
    assert records[0].type == IndexType.CHUNK


async def test_rule5_zeroed_record_before_intact_ones_is_corruption_not_the_end(tmp_path):
    q = open_queue(tmp_path)
    for item in ["m0", "m1", "m2", "m3", "m4"]:
        await put(q, [item])  # one CHUNK record each
    crash(q)
    path = index_path(tmp_path)
    size = os.path.getsize(path)
    offset = FILE_HEADER.size + 2 * REC  # m2's CHUNK record
    raw = bytearray(open(path, "rb").read())
    raw[offset : offset + REC] = bytes(REC)
    open(path, "wb").write(raw)
    reported = []
    from daskqueue.segment.store import SegmentStore

    SegmentStore(str(tmp_path), on_corruption=reported.append).close()
    assert [(e.path, e.offset, e.bytes_dropped) for e in reported] == [(path, offset, REC)]
    assert os.path.getsize(path) == size  # nothing after the zeros was cut off
    q = open_queue(tmp_path)
    assert f"offset {offset}" in (await q.recovery_report())["corruptions"][0]
    assert {v for v, _ in (await drain(q)).values()} == {"m0", "m1", "m3", "m4"}
