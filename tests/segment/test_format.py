"""The byte layouts of FORMAT.md, checked against the code that writes them."""

from __future__ import annotations

import pathlib
import re
import zlib

from daskqueue.segment import format as fmt
from daskqueue.segment.format import ChunkHeader, IndexRecord, IndexType

FORMAT_MD = pathlib.Path(fmt.__file__).with_name("FORMAT.md").read_text()


def _reference_crc32c(data: bytes) -> int:
    """Bitwise CRC-32C (reflected polynomial 0x82F63B78), independent of ``fmt.checksum`` and
    the ``crc32c`` package, so the tests below check the code against the spec, not itself."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def test_record_sizes_match_the_tables():
    assert fmt.FILE_HEADER.size == 16
    assert fmt.LOG_RECORD_HEADER.size == 12
    assert fmt.CHUNK_HEADER.size == 48
    assert fmt.INDEX_RECORD.size == 40
    assert "### Index record (40 bytes)" in FORMAT_MD


def test_each_checksummed_layout_is_its_covered_fields_plus_one_crc():
    assert fmt.FILE_HEADER.size == fmt.FILE_HEADER_FIELDS.size + fmt.CRC.size
    assert fmt.LOG_RECORD_HEADER.size == fmt.CRC.size + fmt.LOG_RECORD_FIELDS.size
    assert fmt.INDEX_RECORD.size == fmt.CRC.size + fmt.INDEX_RECORD_FIELDS.size



def test_file_header_crc_covers_bytes_0_to_12():
    head = fmt.pack_file_header(fmt.LOG_MAGIC)
    assert head[:12] == b"DQLOG\x00\x00\x00" b"\x01\x00" b"\x00\x00"
    assert int.from_bytes(head[12:16], "little") == _reference_crc32c(head[:12])
    # The index header's bytes, copied from FORMAT.md's worked example.
    assert fmt.pack_file_header(fmt.INDEX_MAGIC) == bytes.fromhex("4451494e44455800 0100 0000 13c42126")


def test_checksum_is_crc32c_not_zlib_crc32():
    assert fmt.checksum(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert _reference_crc32c(b"123456789") == 0xE3069283
    assert fmt.checksum(b"") == 0 and fmt.checksum(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4
    assert fmt.checksum(b"123456789") != zlib.crc32(b"123456789")


def _hex_line(label):
    line = next(l for l in FORMAT_MD.splitlines() if l.startswith(label))
    return bytes.fromhex(" ".join(re.findall(r"\b[0-9a-f]{2}\b", line[len(label):])))


def test_worked_example_checksums_are_crc32c_of_the_documented_bytes():
    header = _hex_line("header")
    assert len(header) == 16 and int.from_bytes(header[12:], "little") == _reference_crc32c(header[:12])
    for label in ("CHUNK ", "LEASE ", "ACK "):
        record = _hex_line(label)
        assert len(record) == 40 and int.from_bytes(record[:4], "little") == _reference_crc32c(record[4:])
    assert _hex_line("CHUNK ")[4:] == bytes([1, 0, 0, 0]) + (0).to_bytes(8, "little") + bytes.fromhex(
        "02000000" "01000000" "1000000000000000" "0000000000000000"
    )


def test_worked_example_matches_format_md():
    assert _hex_line("header") == fmt.pack_file_header(fmt.INDEX_MAGIC)
    assert _hex_line("CHUNK ") == IndexRecord(IndexType.CHUNK, 0, 2, 0, 1, 16).to_bytes()
    assert _hex_line("LEASE ") == IndexRecord(IndexType.LEASE, 0, 2).to_bytes()
    assert _hex_line("ACK ") == IndexRecord(IndexType.ACK, 0, 2).to_bytes()


def test_index_record_round_trips_and_checksum_covers_every_field():
    record = IndexRecord(IndexType.RETRY, 2**40 + 7, 123, 3, 9, 4096, 1.5e9)
    raw = record.to_bytes()
    assert IndexRecord.is_intact(raw) and IndexRecord.from_bytes(raw) == record
    for i in range(4, 40):
        flipped = bytearray(raw)
        flipped[i] ^= 0x01
        assert not IndexRecord.is_intact(bytes(flipped)), f"byte {i} not covered"


def test_log_record_checksum_covers_the_length():
    raw = fmt.pack_log_record(fmt.LogType.FUNC, b"x" * 20)
    assert raw[4:12] == bytes.fromhex("14000000" "02" "000000")  # length 20, FUNC, reserved
    crc = int.from_bytes(raw[:4], "little")
    assert crc == _reference_crc32c(raw[4:])  # bytes 4 .. 12+length
    torn = raw[:4] + (19).to_bytes(4, "little") + raw[8:]
    assert crc != _reference_crc32c(torn[4 : 12 + 19])  # what a reader checks for the torn length


def test_chunk_header_round_trips_with_strings_and_digest():
    header = ChunkHeader(10, 3, -2, 1, b"d" * 16, "pages", "doc-7", 123.25)
    raw = header.to_bytes() + b"rest"
    back, size = ChunkHeader.from_bytes(raw)
    assert back == header and raw[size:] == b"rest"


def test_file_names_sort_in_numeric_order():
    names = [fmt.log_name(n) for n in (10, 9, 100)]
    assert sorted(names) == [fmt.log_name(9), fmt.log_name(10), fmt.log_name(100)]
    assert fmt.index_name(1) == "00000000000000000001.index"
