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
    "DIGEST_SIZE",
    "CRC",
    "FILE_HEADER_FIELDS",
    "FILE_HEADER",
    "LOG_RECORD_FIELDS",
    "LOG_RECORD_HEADER",
    "CHUNK_HEADER",
    "CHUNK_PRODUCER",
    "HAS_PRODUCER",
    "PAYLOAD_OFFSET",
    "MAX_NAME_BYTES",
    "INDEX_RECORD_FIELDS",
    "INDEX_RECORD",
    "LogType",
    "IndexType",
    "IndexRecord",
    "ChunkHeader",
    "TOKEN_SIZE",
    "token_record",
    "record_token",
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


def checksum(data: bytes | memoryview, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing ``crc``: the only checksum in the format."""
    return _crc32c.crc32c(data, crc)


def _then(first: struct.Struct, second: struct.Struct) -> struct.Struct:
    """One struct of ``first``'s fields followed by ``second``'s (both little-endian)."""
    return struct.Struct("<" + first.format.lstrip("<") + second.format.lstrip("<"))


DIGEST_SIZE = 16  # a function's digest: BLAKE2b-128 of its pickle (CHUNK header, FUNC body)

CRC = struct.Struct(
    "<"
    "I"  # CRC-32C: of the fields before it (file header) or after it (records)
)

FILE_HEADER_FIELDS = struct.Struct(  # what the header's CRC covers
    "<"
    "8s"  # magic
    "H"  # format version
    "H"  # reserved, 0
)
FILE_HEADER = _then(FILE_HEADER_FIELDS, CRC)

LOG_RECORD_FIELDS = struct.Struct(  # the header fields the record's CRC covers, with the body
    "<"
    "I"  # body length
    "B"  # LogType
    "3x"  # reserved, 0
)
LOG_RECORD_HEADER = _then(CRC, LOG_RECORD_FIELDS)

CHUNK_HEADER = struct.Struct(
    "<"
    "Q"  # base sequence number
    "I"  # count of messages
    "i"  # priority
    "B"  # kind (messages.Kind)
    "B"  # flags: bit 0 = has digest
    "H"  # length of the type string
    "H"  # length of the key string
    "e"  # time limit in seconds, a half float (0 = none; this was a reserved u16 0)
    f"{DIGEST_SIZE}s"  # function digest, zeros if none
    "d"  # not-before, wall clock (0 = none)
)

#: The longest type or routing key, in UTF-8 bytes, a CHUNK header holds (a u16 length each).
MAX_NAME_BYTES = (1 << 8 * struct.calcsize("<H")) - 1

PAYLOAD_OFFSET = struct.Struct(
    "<"
    "I"  # one entry of a CHUNK body's payload offsets (count + 1 of them)
)

INDEX_RECORD_FIELDS = struct.Struct(  # what the record's CRC covers
    "<"
    "B"  # IndexType
    "B"  # attempts
    "H"  # reserved, 0
    "Q"  # first sequence number (or result number)
    "I"  # count of messages
    "I"  # log segment number of the referenced log record (0 = none)
    "Q"  # offset of that record in its segment
    "d"  # time: not-before or lease deadline, wall clock
)
INDEX_RECORD = _then(CRC, INDEX_RECORD_FIELDS)

HAS_DIGEST = 0x01
#: CHUNK flags bit 1: a producer tag (a u32, :data:`CHUNK_PRODUCER`) follows the type and key
#: strings. Chunks of the pool's owner (tag 0) and every chunk of older stores leave it unset.
HAS_PRODUCER = 0x02

CHUNK_PRODUCER = struct.Struct(
    "<"
    "I"  # producer tag: whose handle reads the chunk's outcomes (absent: 0, the pool's owner)
)


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
    TOKEN = 11
    DEAD_DROP = 12
    DEAD_ORDINAL = 13


#: Bytes of a put's idempotency token; a TOKEN index record holds it in its segment and
#: offset fields (4 + 8 bytes, little-endian), so it needs no log record.
TOKEN_SIZE = 12


def token_record(token: bytes, first: int, count: int) -> IndexRecord:
    """The TOKEN index record of a put of ``count`` messages from seq ``first``."""
    if len(token) != TOKEN_SIZE:
        raise ValueError(f"a put token is {TOKEN_SIZE} bytes, got {len(token)}")
    return IndexRecord(IndexType.TOKEN, first, count, 0, int.from_bytes(token[:4], "little"),
                       int.from_bytes(token[4:], "little"))


def record_token(record: IndexRecord) -> bytes:
    """The token a TOKEN index record holds."""
    return record.segment.to_bytes(4, "little") + record.offset.to_bytes(8, "little")


def pack_file_header(magic: bytes, version: int = FORMAT_VERSION) -> bytes:
    fields = FILE_HEADER_FIELDS.pack(magic, version, 0)
    return fields + CRC.pack(checksum(fields))


def pack_log_record(kind: LogType, body: bytes | memoryview) -> bytes:
    rest = LOG_RECORD_FIELDS.pack(len(body), kind) + body
    return CRC.pack(checksum(rest)) + rest


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
        fields = INDEX_RECORD_FIELDS.pack(
            self.type, self.attempts, 0, self.first, self.count, self.segment, self.offset, self.time
        )
        return CRC.pack(checksum(fields)) + fields

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> IndexRecord:
        """Decode a record whose checksum the caller has verified."""
        _, type_, attempts, _, first, count, segment, offset, time = INDEX_RECORD.unpack(buf)
        return cls(IndexType(type_), first, count, attempts, segment, offset, time)

    @staticmethod
    def is_intact(buf: bytes | memoryview) -> bool:
        (crc,) = CRC.unpack_from(buf)
        return crc == checksum(buf[CRC.size : INDEX_RECORD.size])


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
    time_limit_s: float = 0.0
    producer: int = 0

    @staticmethod
    def encoded_size(type_: str | None, key: str | None, producer: int = 0) -> int:
        """Bytes the header of a chunk with this type, key and producer tag takes in its CHUNK body."""
        tag = CHUNK_PRODUCER.size if producer else 0
        return CHUNK_HEADER.size + len((type_ or "").encode()) + len((key or "").encode()) + tag

    def to_bytes(self) -> bytes:
        t = (self.type or "").encode()
        k = (self.key or "").encode()
        flags = (HAS_DIGEST if self.digest is not None else 0) | (HAS_PRODUCER if self.producer else 0)
        head = CHUNK_HEADER.pack(
            self.base_seq, self.count, self.priority, self.kind, flags, len(t), len(k), self.time_limit_s,
            self.digest or bytes(DIGEST_SIZE), self.not_before,
        )
        tag = CHUNK_PRODUCER.pack(self.producer) if self.producer else b""
        return head + t + k + tag

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> tuple[ChunkHeader, int]:
        """Decode the header at the start of a CHUNK body; return it and its size in bytes."""
        base, count, prio, kind, flags, tlen, klen, limit, digest, not_before = CHUNK_HEADER.unpack_from(buf)
        at = CHUNK_HEADER.size
        t = bytes(buf[at : at + tlen]).decode() if tlen else None
        k = bytes(buf[at + tlen : at + tlen + klen]).decode() if klen else None
        end = at + tlen + klen
        producer = 0
        if flags & HAS_PRODUCER:
            (producer,) = CHUNK_PRODUCER.unpack_from(buf, end)
            end += CHUNK_PRODUCER.size
        header = cls(base, count, prio, kind, digest if flags & HAS_DIGEST else None, t, k, not_before,
                     float(limit) if limit > 0 else 0.0, producer)
        return header, end


def log_name(segment: int) -> str:
    return f"{segment:020d}.log"


def index_name(generation: int) -> str:
    return f"{generation:020d}.index"
