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

Functions are pickled once per call of ``batch_submit``/``map`` (and, for functions pickled
by reference, once while among the last :data:`~daskqueue.defaults.FUNCTION_CACHE_ENTRIES`
used) and named by a 16-byte digest; queues and consumers cache them by digest, so a function
mapped over a million inputs crosses the wire a handful of times. Every client-side table of
functions is bounded (:class:`~daskqueue.lru.LRU`), so a caller sending a new function per
request (``submit(lambda: ...)``) does not grow the client without end.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import pickle
import time
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import cloudpickle

from daskqueue import defaults
from daskqueue.errors import InvalidTaskError, PayloadTooLargeError, SerializationError
from daskqueue.function_snapshot import ByValueCache, frozen
from daskqueue.lru import LRU

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


@dataclass(frozen=True, slots=True)
class PickledFunction:
    """A function's pickle and the digest that names it."""

    digest: bytes
    data: bytes


def _by_value(func: Callable[..., Any]) -> bool:
    """True if plain pickle would store ``func``, or what it wraps, by a reference the
    workers cannot resolve. A ``functools.partial`` pickles as its function and arguments,
    each by reference when it can: it goes by value if its function, or a callable (or an
    instance of a class defined in ``__main__``) among its arguments, would not resolve."""
    if _unresolvable(func):
        return True
    if isinstance(func, functools.partial):
        inner = (func.func, *func.args, *func.keywords.values())
        return any(_by_value(x) if callable(x) else type(x).__module__ == "__main__" for x in inner)
    return False


def _unresolvable(obj: Any) -> bool:
    """Whether ``obj``'s pickle by reference names what a worker cannot import: defined in
    ``__main__``, a lambda, or local to a function."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", "")
    return module in (None, "__main__") or "<lambda>" in qualname or "<locals>" in qualname


#: Functions pickled by reference (the pickle is a name: it never changes), by function.
_by_reference_cache: LRU[Any, PickledFunction] = LRU(defaults.FUNCTION_CACHE_ENTRIES)

#: Functions pickled by value, reused while made of the same objects (see
#: :mod:`daskqueue.function_snapshot`).
_by_value_cache = ByValueCache(defaults.FUNCTION_CACHE_ENTRIES)
BY_VALUE_CACHE_MAX_BYTES = _by_value_cache.max_bytes


def pickle_function(func: Callable[..., Any], *, index: int | None = None) -> PickledFunction:
    """Pickle ``func`` (plain pickle by reference, cloudpickle by value where it must).

    Raises :class:`InvalidTaskError` if ``func`` is not callable and :class:`SerializationError`
    if neither pickler can serialise it; ``index`` names the task in the caller's batch.
    """
    if not callable(func):
        where = "" if index is None else f" (task {index} of the batch)"
        raise InvalidTaskError(f"task function {func!r} is not callable{where}")
    try:
        cached = _by_reference_cache.get(func)
    except TypeError:  # unhashable callable object
        cached = None
    if cached is not None:
        return cached
    by_value = _by_value(func)
    if by_value:
        return _by_value_cache.get_or_make(func, lambda: _pickle_new(func, index, True))
    return _pickle_new(func, index, by_value)


def _pickle_new(func: Callable[..., Any], index: int | None, by_value: bool) -> PickledFunction:
    """Pickle ``func`` now (see :func:`pickle_function`)."""
    try:
        data = cloudpickle.dumps(func, PROTOCOL) if by_value else pickle.dumps(func, PROTOCOL)
    except Exception as first:
        try:
            data = cloudpickle.dumps(func, PROTOCOL)
            by_value = True
        except Exception as e:
            where = "" if index is None else f" (task {index} of the batch)"
            raise SerializationError(f"cannot pickle function {func!r}{where}: {e}", index=index) from first
    pickled = PickledFunction(hashlib.blake2b(data, digest_size=16).digest(), data)
    if not by_value and _pickle_cannot_change(func):
        try:
            _by_reference_cache.put(func, pickled)
        except TypeError:
            pass
    return pickled


def _pickle_cannot_change(func: Callable[..., Any]) -> bool:
    """Whether ``func``'s pickle stays the same while it is the same object, so it may be
    kept by identity: a function or class (its pickle is its name), or a ``partial`` of one
    with immutable arguments. A callable instance, a bound method or a partial holding a
    list pickles the state it holds at that moment: kept, later calls would send stale
    state (a partial's list appended to after its first ``submit``)."""
    if isinstance(func, functools.partial):
        return frozen((func.func, func.args, tuple(func.keywords.items())))
    return frozen(func)


class SentFunctions:
    """The digests of the functions one queue was sent, as far as the client remembers: the
    last :data:`~daskqueue.defaults.SENT_FUNCTIONS_PER_QUEUE` added.

    Used like a ``set`` of digests (``in``, ``add``, ``update``; adding one again makes it
    the newest). Forgetting a digest costs only sending its function again, which a queue
    that still holds it ignores; remembering one the queue no longer holds is what a queue
    that evicts functions must answer (it names the missing digests). Thread-safe.
    """

    def __init__(self, max_entries: int = defaults.SENT_FUNCTIONS_PER_QUEUE) -> None:
        self._digests: LRU[bytes, bool] = LRU(max_entries)

    def __contains__(self, digest: object) -> bool:
        return digest in self._digests

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"<SentFunctions: {len(self._digests)} of {self._digests.max_entries}>"

    def add(self, digest: bytes) -> None:
        self._digests.put(digest, True)

    def update(self, digests: Iterable[bytes]) -> None:
        for digest in digests:
            self._digests.put(digest, True)

    def discard(self, digest: bytes) -> None:
        """Forget ``digest`` (its queue said it no longer holds the function)."""
        self._digests.pop(digest)

    def unsent(self, funcs: dict[bytes, bytes]) -> dict[bytes, bytes]:
        """The entries of ``funcs`` (digest -> pickle) whose digest is not remembered."""
        return {d: data for d, data in funcs.items() if d not in self._digests}


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
    one copy of an object it meets twice."""
    flat = [
        (g.kind, g.digest, g.type, g.priority, g.key, g.delay_s, g.count, g.offsets, g.data, g.due_epoch,
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
    return pickle.dumps((lease_id, queue_index, segments), PROTOCOL)


def decode_delivery(blob: bytes) -> tuple[int, int, list[Segment]]:
    lease_id, queue_index, segments = pickle.loads(blob)
    return lease_id, queue_index, segments


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
