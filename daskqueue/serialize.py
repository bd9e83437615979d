"""Pickling of functions and payloads, and the blobs that cross actor boundaries.

Every hot-path actor call carries ONE ``bytes`` blob (Dask serialises a list of objects item
by item, a blob in one copy). A blob is one ``pickle.dumps`` of a flat tuple whose large parts
are ``bytes``: the payloads of many messages concatenated, with a ``uint32`` offsets array.

A put group of small payloads travels *packed* (:func:`pack_list`): one pickle of the list of
its messages' payloads instead of one pickle per message (about 5x less client CPU per
message). Queues keep the packed blob as it came, once per chunk, and never unpickle it; a
leased part of it travels as the blob and the index range of its messages, and the consumer
unpickles the blob once per delivery. Objects shared by several payloads of one packed group
stay shared when unpickled (as with ``ProcessPoolExecutor.map(chunksize=...)``); an object
passed to many tasks is pickled once per group. Durable queues store one record per message
(``segment/FORMAT.md``) and take only the per-message form.

Functions are pickled on the client by :mod:`daskqueue.function_pickle` (re-exported here)
and named by a 16-byte digest; queues and consumers cache them by digest, so a function
mapped over a million inputs crosses the wire a handful of times.
"""

from __future__ import annotations

import functools
import itertools
import pickle
import time
from array import array
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence

import cloudpickle

from daskqueue.errors import PayloadTooLargeError, SerializationError
# Function pickling lives in its own module; these names stay importable from here.
from daskqueue.function_pickle import BY_VALUE_CACHE_MAX_BYTES, PickledFunction, SentFunctions, pickle_function  # noqa: F401

__all__ = [
    "PickledFunction",
    "pickle_function",
    "SentFunctions",
    "pack_payloads",
    "pack_list",
    "PACK_MAX_BYTES",
    "PACK_MAX_MESSAGES",
    "unpack",
    "packed_item",
    "packed_item_pickle",
    "Group",
    "ChunkMeta",
    "encode_put",
    "decode_put",
    "Segment",
    "encode_delivery",
    "decode_delivery",
    "encode_settle",
    "decode_settle",
    "ResultRecord",
    "TaggedResultRecord",
    "encode_records",
    "decode_records",
    "dumps",
    "loads",
    "PackedRef",
    "load_payload",
    "dead_rows",
]

PROTOCOL = pickle.HIGHEST_PROTOCOL
loads = pickle.loads


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` with plain pickle, falling back to cloudpickle (lambdas, closures...)."""
    try:
        return pickle.dumps(obj, PROTOCOL)
    except Exception:
        return cloudpickle.dumps(obj, PROTOCOL)


def pack_payloads(
    objs: Sequence[Any], *, max_message_bytes: int, what: str = "argument", first_index: int = 0
) -> tuple[bytes, bytes]:
    """Pickle each object; return ``(offsets, data)``: uint32 offsets (n+1) and the bytes.

    A failure names the object's index (``first_index`` + position) in a
    :class:`SerializationError`; an object larger than ``max_message_bytes`` raises
    :class:`PayloadTooLargeError`. Nothing is sent before everything is packed.
    """
    try:
        pickles = list(map(_fast_dumps, objs))
    except Exception:
        pickles = []
        for i, obj in enumerate(objs):
            try:
                pickles.append(dumps(obj))
            except Exception as e:
                index = first_index + i
                raise SerializationError(
                    f"cannot pickle the {what} of task {index}: {type(e).__name__}: {e}", index=index
                ) from e
    sizes = list(map(len, pickles))
    biggest = max(sizes, default=0)
    if biggest > max_message_bytes:
        index = first_index + sizes.index(biggest)
        raise PayloadTooLargeError(biggest, max_message_bytes, index=index)
    offsets = array("I", itertools.accumulate(sizes, initial=0)) if sum(sizes) < 2**32 else None
    if offsets is None:
        raise PayloadTooLargeError(sum(sizes), 2**32 - 1)
    return offsets.tobytes(), b"".join(pickles)


_fast_dumps = functools.partial(pickle.dumps, protocol=PROTOCOL)

# Packed put groups (one pickle per group of small payloads) are daskqueue/packed.py's; its
# names are re-exported here, where the wire format's other parts are.
from daskqueue.packed import (  # noqa: E402
    PACK_MAX_BYTES,
    PACK_MAX_MESSAGES,
    PackedRef,
    dead_rows,
    load_payload,
    pack_list,
    packed_item,
    packed_item_pickle,
    unpack,
)


# -- put: client -> queue -------------------------------------------------------------------------


class ChunkMeta(NamedTuple):
    """What the messages of one put group share besides priority: a queue keeps one per chunk
    and returns it with each dead letter."""

    kind: int
    digest: bytes | None
    type: str | None
    key: str | None
    time_limit_s: float = 0.0  # 0: none
    producer: int = 0  # who reads the outcomes: 0 the pool's owner, else an attached handle's tag


@dataclass(frozen=True, slots=True)
class Group:
    """Messages of one put that share kind, function, type, priority, key and delay."""

    kind: int
    digest: bytes | None
    type: str | None
    priority: int
    key: str | None
    delay_s: float
    count: int
    offsets: bytes
    data: bytes
    #: A due time in seconds since the epoch (``eta=``), or 0: then ``delay_s`` counts from
    #: the put's arrival. Absolute, so that every put of one call falls due at one instant
    #: however long the call takes to send.
    due_epoch: float = 0.0
    #: Seconds a message may run before it is interrupted (0: no limit).
    time_limit_s: float = 0.0
    #: The producer tag whose handle reads these messages' outcomes (0: the pool's owner;
    #: see :mod:`daskqueue.producers`).
    producer: int = 0
    #: 0: per-message form (``offsets`` delimit one pickle per message in ``data``). Else a
    #: packed group: ``data`` is one pickle of a list of ``packed`` payloads (or of the
    #: 1-tuple of a list of ``packed`` one-argument calls' arguments), these messages are
    #: its items ``first .. first + count`` and ``offsets`` is empty (see the module
    #: docstring; :func:`pack_list`, :func:`unpack`).
    packed: int = 0
    first: int = 0

    def meta(self) -> ChunkMeta:
        return ChunkMeta(self.kind, self.digest, self.type, self.key, self.time_limit_s, self.producer)

    def delay_now(self) -> float:
        """Seconds from now until these messages are due (0: ready now)."""
        return max(0.0, self.due_epoch - time.time()) if self.due_epoch else self.delay_s


def encode_put(groups: Iterable[Group], funcs: dict[bytes, bytes]) -> bytes:
    """A put blob: each group as a flat tuple, its trailing fields left out while they hold
    their defaults (a per-message group of the owner keeps the oldest layout). Groups that
    share a packed blob (parts of one chunk, moved or replayed) carry it once: pickle keeps
    one copy of an object it meets twice. The kind goes as a plain int (every reader
    compares it with ``==``): a :class:`Kind` member pickles by reference, a module look-up
    and a Python call of ``Kind(n)`` when it is read, and it would ride on to the queue's
    chunk, every delivery and the child's frame (~4 us warm per pickle or unpickle, four or
    more on the path of each single task)."""
    flat = [
        (int(g.kind), g.digest, g.type, g.priority, g.key, g.delay_s, g.count, g.offsets, g.data, g.due_epoch,
         g.time_limit_s) + ((g.producer, g.packed, g.first) if g.packed else (g.producer,) if g.producer else ())
        for g in groups
    ]
    return pickle.dumps((funcs, flat), PROTOCOL)


def decode_put(blob: bytes) -> tuple[dict[bytes, bytes], list[Group]]:
    funcs, flat = pickle.loads(blob)
    return funcs, [Group(*g) for g in flat]


# -- delivery: queue -> consumer ------------------------------------------------------------------


class Segment(NamedTuple):
    """Consecutive messages of one delivery that come from one put group.

    A tuple type: the queue builds them and a delivery blob pickles them as they are (one per
    span, never one per message), so decoding needs no re-wrapping.
    """

    first_seq: int
    count: int
    attempts: int
    kind: int
    digest: bytes | None
    type: str | None
    priority: int
    key: str | None
    offsets: bytes  # uint32 offsets of the chunk, count + 1 of them, not rebased
    data: bytes  # the payloads, starting at offsets[0]
    time_limit_s: float = 0.0  # how long each message may run (0: no limit)
    producer: int = 0  # the producer tag of the put (what follow-ups enqueued by these messages carry)
    #: 0: per message (``offsets`` delimit each payload's pickle). Else ``data`` is a packed
    #: blob of ``packed`` payloads (see :class:`Group`) of which these messages are items
    #: ``first .. first + count``; ``offsets`` is empty.
    packed: int = 0
    first: int = 0

    def values(self) -> list[Any]:
        """Each message's payload, unpickled, in order: a packed blob is unpickled once (an
        error then concerns every message of the segment); per-message payloads one by one
        (the first that fails raises)."""
        if self.packed:
            items, one_argument = unpack(self.data, self.first, self.count)
            return [(x,) for x in items] if one_argument else items
        return list(map(pickle.loads, self.payloads()))

    def unpacked(self) -> tuple[list[Any], bool]:
        """A packed segment's :func:`unpack`: ``(items, one_argument)``, its payloads or,
        with ``one_argument``, each payload's one argument (the hot path of a ``map``)."""
        return unpack(self.data, self.first, self.count)

    def payloads(self) -> Iterable[bytes]:
        """Each message's payload bytes, in order. A packed segment's payloads are pickled
        again one by one for this (slow: consumers read :meth:`values` instead)."""
        if self.packed:
            return map(_fast_dumps, self.values())
        offs = array("I")
        offs.frombytes(self.offsets)
        base = offs[0]
        data = self.data
        return (data[a - base : b - base] for a, b in zip(offs, itertools.islice(offs, 1, None)))


def encode_delivery(lease_id: int, queue_index: int, segments: list[Segment]) -> bytes:
    """A delivery blob; each segment goes as a plain tuple (:func:`decode_delivery` makes the
    :class:`Segment` again): a named tuple pickles by reference, a module look-up and two
    Python calls (``__getnewargs__``, ``__new__``) per segment, ~5 us warm on the path of
    every single task against ~1 us."""
    return pickle.dumps((lease_id, queue_index, [tuple(s) for s in segments]), PROTOCOL)


def decode_delivery(blob: bytes) -> tuple[int, int, list[Segment]]:
    lease_id, queue_index, segments = pickle.loads(blob)
    return lease_id, queue_index, [Segment._make(s) for s in segments]


# -- settle: consumer -> queue --------------------------------------------------------------------


def encode_settle(
    done: int, errors: dict[int, bytes], fatal: set[int], results: bytes | None, consumer: int | None = None
) -> bytes:
    return pickle.dumps((done, errors, sorted(fatal), results, consumer), PROTOCOL)


def decode_settle(blob: bytes) -> tuple[int, dict[int, bytes], set[int], bytes | None, int | None]:
    """``(done, errors, fatal, results, consumer index or None)`` of a settle blob."""
    fields = pickle.loads(blob)
    done, errors, fatal, results = fields[:4]
    return done, errors, set(fatal), results, (fields[4] if len(fields) > 4 else None)


# -- results: queue -> client ---------------------------------------------------------------------


class ResultRecord(NamedTuple):
    """The outcomes of one settle (or ``record_outcomes``) call, as a queue keeps them until
    the client fetches them.

    ``ranges`` are the ``(first_seq, count)`` of the messages that ran, in order (one per
    span, never merged); ``failed`` their failed positions; ``results`` the consumer's pickled
    list, one entry per message that ran; ``final_errors`` maps positions to errors of
    early-acked messages (final failures), or is None.
    """

    queue: int
    ranges: list[tuple[int, int]]
    failed: list[int]
    results: bytes
    final_errors: dict[int, bytes] | None
    consumer: int | None = None  # the index of the consumer that ran them (None: not said)

    def to_bytes(self) -> bytes:
        """The stored form (a durable queue's RESULT log record): a plain pickled tuple."""
        return pickle.dumps(tuple(self), PROTOCOL)

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> ResultRecord | TaggedResultRecord:
        """Read the stored form (also a pickled ``ResultRecord``, or a tuple of a
        longer future layout: only the first fields are read); a 7-field tuple is a
        :class:`TaggedResultRecord`."""
        fields = pickle.loads(data)
        if len(fields) >= len(TaggedResultRecord._fields) and fields[len(cls._fields)]:
            return TaggedResultRecord(*fields[: len(TaggedResultRecord._fields)])
        return cls(*fields[: len(cls._fields)])

    def tagged(self, producer: int) -> ResultRecord | TaggedResultRecord:
        """This record for producer ``producer`` (0, the pool's owner: this record itself)."""
        return TaggedResultRecord(*self, producer) if producer else self


class TaggedResultRecord(NamedTuple):
    """A :class:`ResultRecord` of messages an attached producer put (its ``producer`` tag,
    see :mod:`daskqueue.producers`): the same fields and one more at the end, so that the
    owner's records keep their old layout (in memory and on disk)."""

    queue: int
    ranges: list[tuple[int, int]]
    failed: list[int]
    results: bytes
    final_errors: dict[int, bytes] | None
    consumer: int | None = None
    producer: int = 0

    def to_bytes(self) -> bytes:
        return pickle.dumps(tuple(self), PROTOCOL)


def encode_records(records: list[ResultRecord | TaggedResultRecord]) -> bytes:
    """Result records as a client's outcome poll gets them (:func:`decode_records`): plain
    tuples, as named tuples pickled by reference cost a look-up and two Python calls per
    record on the path of every single task (~4.5 us warm each way against ~2)."""
    return pickle.dumps([tuple(r) for r in records], PROTOCOL)


def decode_records(blob: bytes) -> list[ResultRecord | TaggedResultRecord]:
    """The records of an :func:`encode_records` blob (or of a pickled list of records)."""
    return [r if type(r) is not tuple else TaggedResultRecord._make(r) if len(r) == len(TaggedResultRecord._fields)
            else ResultRecord._make(r) for r in pickle.loads(blob)]
