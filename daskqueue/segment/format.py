"""The byte layouts of FORMAT.md, one ``struct.Struct`` per record; sizes come from ``.size``."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import crc32c as _crc32c

__all__ = [
    "checksum",
    "FORMAT_VERSION",
    "LOG_MAGIC",
    "INDEX_MAGIC",
    "FILE_HEADER",
    "LOG_RECORD_HEADER",
    "CHUNK_HEADER",
    "INDEX_RECORD",
    "LogType",
    "IndexType",
    "IndexRecord",
    "ChunkHeader",
    "pack_file_header",
    "pack_log_record",
    "log_name",
    "index_name",
]

FORMAT_VERSION = 1
LOG_MAGIC = b"DQLOG\x00\x00\x00"
INDEX_MAGIC = b"DQINDEX\x00"
MARKER_NAME = "DASKQUEUE"
MARKER_TEXT = b"daskqueue queue store\n"
LOCK_NAME = "LOCK"


def checksum(data: bytes | memoryview) -> int:
    """CRC-32C (Castagnoli) of ``data``: the only checksum in the format."""
    return _crc32c.crc32c(data)


FILE_HEADER = struct.Struct(
    "<"
    "8s"  # magic
    "H"  # format version
    "H"  # reserved, 0
    "I"  # CRC-32C of the 12 bytes before it
)

LOG_RECORD_HEADER = struct.Struct(
    "<"
    "I"  # CRC-32C of everything after it: length, type, reserved, body
    "I"  # body length
    "B"  # LogType
    "3x"  # reserved, 0
)

CHUNK_HEADER = struct.Struct(
    "<"
    "Q"  # base sequence number
    "I"  # count of messages
    "i"  # priority
    "B"  # kind (messages.Kind)
    "B"  # flags: bit 0 = has digest
    "H"  # length of the type string
    "H"  # length of the key string
    "H"  # reserved, 0
    "16s"  # function digest, zeros if none
    "d"  # not-before, wall clock (0 = none)
)

INDEX_RECORD = struct.Struct(
    "<"
    "I"  # CRC-32C of the remaining bytes
    "B"  # IndexType
    "B"  # attempts
    "H"  # reserved, 0
    "Q"  # first sequence number (or result number)
    "I"  # count of messages
    "I"  # log segment number of the referenced log record (0 = none)
    "Q"  # offset of that record in its segment
    "d"  # time: not-before or lease deadline, wall clock
)

HAS_DIGEST = 0x01


class LogType(IntEnum):
    CHUNK = 1
    FUNC = 2
    ERROR = 3
    RESULT = 4


class IndexType(IntEnum):
    CHUNK = 1
    LEASE = 2
    ACK = 3
    RETRY = 4
    RELEASE = 5
    DEAD = 6
    FUNC = 7
    RESULT = 8
    RESULT_DROP = 9
    WATERMARK = 10


def pack_file_header(magic: bytes, version: int = FORMAT_VERSION) -> bytes:
    head = FILE_HEADER.pack(magic, version, 0, 0)[:12]
    return head + struct.pack("<I", checksum(head))


def pack_log_record(kind: LogType, body: bytes | memoryview) -> bytes:
    rest = struct.pack("<IB3x", len(body), kind) + body
    return struct.pack("<I", checksum(rest)) + rest


@dataclass(frozen=True, slots=True)
class IndexRecord:
    """One state transition of FORMAT.md's index."""

    type: IndexType
    first: int
    count: int = 0
    attempts: int = 0
    segment: int = 0
    offset: int = 0
    time: float = 0.0

    def to_bytes(self) -> bytes:
        body = INDEX_RECORD.pack(
            0, self.type, self.attempts, 0, self.first, self.count, self.segment, self.offset, self.time
        )[4:]
        return struct.pack("<I", checksum(body)) + body

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> IndexRecord:
        """Decode a record whose checksum the caller has verified."""
        _, type_, attempts, _, first, count, segment, offset, time = INDEX_RECORD.unpack(buf)
        return cls(IndexType(type_), first, count, attempts, segment, offset, time)

    @staticmethod
    def is_intact(buf: bytes | memoryview) -> bool:
        (crc,) = struct.unpack_from("<I", buf)
        return crc == checksum(buf[4 : INDEX_RECORD.size])


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    base_seq: int
    count: int
    priority: int
    kind: int
    digest: bytes | None
    type: str | None
    key: str | None
    not_before: float

    def to_bytes(self) -> bytes:
        t = (self.type or "").encode()
        k = (self.key or "").encode()
        flags = HAS_DIGEST if self.digest is not None else 0
        head = CHUNK_HEADER.pack(
            self.base_seq, self.count, self.priority, self.kind, flags, len(t), len(k), 0,
            self.digest or bytes(16), self.not_before,
        )
        return head + t + k

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> tuple[ChunkHeader, int]:
        """Decode the header at the start of a CHUNK body; return it and its size in bytes."""
        base, count, prio, kind, flags, tlen, klen, _, digest, not_before = CHUNK_HEADER.unpack_from(buf)
        at = CHUNK_HEADER.size
        t = bytes(buf[at : at + tlen]).decode() if tlen else None
        k = bytes(buf[at + tlen : at + tlen + klen]).decode() if klen else None
        header = cls(base, count, prio, kind, digest if flags & HAS_DIGEST else None, t, k, not_before)
        return header, at + tlen + klen


def log_name(segment: int) -> str:
    return f"{segment:020d}.log"


def index_name(generation: int) -> str:
    return f"{generation:020d}.index"
