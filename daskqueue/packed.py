"""Packed put groups: the payloads of a put group's messages as ONE pickle (a memory pool's
groups of small payloads), instead of one pickle per message; and the forms a packed
message takes when it leaves its chunk alone (a dead letter's listing, a replay).

A queue never unpickles a packed blob: a lease carries it whole with the span's index range,
and the consumer unpickles it once per delivery (:func:`unpack`). Re-exported by
:mod:`daskqueue.serialize`.
"""

from __future__ import annotations

import pickle
from typing import Any, Sequence

__all__ = [
    "PACK_MAX_BYTES",
    "PACK_MAX_MESSAGES",
    "pack_list",
    "unpack",
    "packed_item",
    "packed_item_pickle",
    "PackedRef",
    "load_payload",
    "dead_rows",
]

PROTOCOL = pickle.HIGHEST_PROTOCOL


#: The largest packed blob (one pickle of a put group's payloads). A lease may take a few
#: messages of a packed chunk and still carries (and its consumer unpickles) the whole
#: blob, so it is kept small: a few hundred microseconds to unpickle.
PACK_MAX_BYTES: int = 256 * 2**10

#: The most messages in one packed group, for the same reason: a consumer whose lease takes
#: one message of a packed chunk unpickles at most this many payloads.
PACK_MAX_MESSAGES: int = 1000


class _Full(Exception):
    """A :class:`_Bounded` buffer was asked to take more than its bound."""


class _Bounded:
    """A write-only buffer that refuses to grow past ``max_bytes``: a pickler writing to it
    stops soon after that many bytes (one frame later), not after pickling a huge object."""

    __slots__ = ("parts", "size", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.max_bytes = max_bytes

    def write(self, data: Any) -> int:
        n = len(data)
        self.size += n
        if self.size > self.max_bytes:
            raise _Full
        self.parts.append(bytes(data))
        return n


def pack_list(objs: Sequence[Any], *, max_bytes: int, one_argument: bool = False) -> bytes | None:
    """A packed blob of the payloads ``objs``: one plain pickle of ``list(objs)``, or with
    ``one_argument`` (each object is the one argument of a call, whose payload is
    ``(obj,)``) of the 1-tuple ``(list(objs),)``, which spares a tuple per message on both
    sides. None if it would be over ``max_bytes`` (it stops pickling soon after that many
    bytes). Raises what plain pickle raises (an object only cloudpickle can pickle, or none
    can): callers then pickle the payloads one by one with :func:`pack_payloads`, which
    names the bad one. :func:`unpack` reads it."""
    out = _Bounded(max_bytes)
    items = objs if type(objs) is list else list(objs)
    try:
        pickle.Pickler(out, PROTOCOL).dump((items,) if one_argument else items)
    except _Full:
        return None
    return out.parts[0] if len(out.parts) == 1 else b"".join(out.parts)


def unpack(blob: bytes, first: int = 0, count: int | None = None) -> tuple[list[Any], bool]:
    """``(items, one_argument)`` of the messages ``first .. first + count`` of a packed blob
    (all by default): their payloads, or with ``one_argument`` each payload's one argument
    (the payload is ``(item,)``; see :func:`pack_list`)."""
    obj = pickle.loads(blob)
    one_argument = type(obj) is tuple
    items = obj[0] if one_argument else obj
    if first or (count is not None and count != len(items)):
        items = items[first : first + (len(items) if count is None else count)]
    return items, one_argument


def packed_item(blob: bytes, index: int) -> Any:
    """Payload ``index`` of a packed blob (what a :func:`packed_item_pickle` calls when
    loaded)."""
    (item,), one_argument = unpack(blob, index, 1)
    return (item,) if one_argument else item


class _PackedItem:
    """Pickles as a call of :func:`packed_item`: see :func:`packed_item_pickle`."""

    __slots__ = ("blob", "index")

    def __init__(self, blob: bytes, index: int) -> None:
        self.blob = blob
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return packed_item, (self.blob, self.index)


class PackedRef:
    """Payload ``index`` of a packed ``blob``, not unpickled: what a queue's dead-letter
    listing carries for a packed message. Rows of one chunk share one blob object, and the
    listing is one pickle, so each blob travels once (its own pickle per row copied the
    whole group's blob into every row). :func:`load_payload` reads it."""

    __slots__ = ("blob", "index")

    def __init__(self, blob: bytes, index: int) -> None:
        self.blob = blob
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return PackedRef, (self.blob, self.index)


def load_payload(data: bytes | PackedRef, cache: dict[int, Any]) -> Any:
    """A message's payload from a dead-letter row's ``data``: its pickle, or a
    :class:`PackedRef` (``cache`` keeps each blob unpickled once, by identity, for as long
    as the caller holds the rows)."""
    if not isinstance(data, PackedRef):
        return pickle.loads(data)
    key = id(data.blob)
    if key not in cache:
        obj = pickle.loads(data.blob)
        cache[key] = (data.blob, obj)  # the blob kept alive with it: its id stays its own
    obj = cache[key][1]
    return (obj[0][data.index],) if type(obj) is tuple else obj[data.index]


def dead_rows(answer: bytes | list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The rows of a queue's ``dead_letters`` answer (one pickle; a list from older queues)."""
    return pickle.loads(answer) if isinstance(answer, (bytes, bytearray)) else list(answer)


def packed_item_pickle(blob: bytes, index: int) -> bytes:
    """A pickle whose ``pickle.loads`` is payload ``index`` of the packed ``blob``: one
    message's payload bytes, made without unpickling the blob (a queue never unpickles user
    data), e.g. for a dead letter's listing. It holds the whole blob."""
    return pickle.dumps(_PackedItem(bytes(blob), index), PROTOCOL)
