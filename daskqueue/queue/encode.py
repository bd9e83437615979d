"""Encoding a submission into put batches: pure functions, no Dask, no I/O.

A call of ``submit``/``batch_submit``/``map``/``put_many`` becomes a list of :class:`PutBatch`,
one per ``put_batch`` call: its messages cut into chunks of consecutive input positions
(:func:`encode_chunks`, the one chunk loop), each chunk's messages grouped by kind and
function and their payloads pickled into one blob per group (:func:`pack`). Everything is
encoded before anything is sent, so a bad task enqueues nothing.

This is the submit hot path: the work per message is one pickle (``pack_payloads``) and, for
mixed calls, one dict look-up; everything else is per chunk or per group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple, Sequence

from daskqueue.errors import InvalidTaskError, PayloadTooLargeError, SerializationError
from daskqueue.messages import Kind
from daskqueue.queue.router import even_ranges
from daskqueue.serialize import Group, PickledFunction, pack_payloads, pickle_function
from daskqueue.validate import check_label

__all__ = [
    "PutOptions",
    "PutBatch",
    "Call",
    "chunk_size",
    "encode_chunks",
    "encode_payloads",
    "encode_uniform",
    "encode_calls",
    "calls_from_tasks",
    "pack",
    "encode_keyed",
]

#: One task: its function, positional arguments and keyword arguments (``None`` if none).
Call = tuple[Callable[..., Any], tuple[Any, ...], "dict[str, Any] | None"]


@dataclass(frozen=True, slots=True)
class PutOptions:
    """What every message of one submission shares (validated by the caller, but for the
    labels: a ``type`` or ``key`` a queue cannot store raises :class:`FieldTooLongError` here,
    so before anything is encoded or sent)."""

    type: str | None = None
    priority: int = 0
    key: str | None = None
    delay_s: float = 0.0
    due_epoch: float = 0.0  # eta=: seconds since the epoch (then delay_s is 0)
    time_limit_s: float = 0.0  # how long each message may run (0: no limit)

    def __post_init__(self) -> None:
        check_label("type", self.type)
        check_label("key", self.key)

    def group(self, kind: int, digest: bytes | None, count: int, offsets: bytes, data: bytes) -> Group:
        """A put group of ``count`` packed messages with these options."""
        return Group(kind, digest, self.type, self.priority, self.key, self.delay_s, count, offsets, data,
                     self.due_epoch, self.time_limit_s)


class PutBatch(NamedTuple):
    """The messages of one ``put_batch`` call, before it is sent to a queue."""

    groups: list[Group]
    #: ``digest -> pickled function`` of every group's function (the pool sends only those
    #: the queue does not have yet).
    funcs: dict[bytes, bytes]
    #: The input positions of each group's messages, in message order (a ``range`` when they
    #: are consecutive).
    positions: list[Sequence[int]]


def chunk_size(n: int, *, n_queues: int, put_batch_size: int) -> int:
    """Messages per put for a call of ``n`` messages: spread over every queue, at most
    ``put_batch_size`` per put, at least one."""
    return max(1, min(put_batch_size, -(-n // n_queues)))


def encode_chunks(n: int, size: int, encode_chunk: Callable[[range], PutBatch], *,
                  batches: int | None = None) -> list[PutBatch]:
    """The chunk loop: ``encode_chunk(positions)`` for consecutive ranges of at most ``size``
    of the positions ``0 .. n``, in order; with ``batches``, that many ranges instead, of
    sizes that differ by at most one (the router's plan, so that each queue gets as many
    messages as the others)."""
    if batches is not None:
        return [encode_chunk(r) for r in even_ranges(n, batches)]
    return [encode_chunk(range(lo, min(lo + size, n))) for lo in range(0, n, size)]


def encode_payloads(
    sources: Sequence[Any],
    to_payloads: Callable[[Sequence[Any]], Sequence[Any]] | None,
    *,
    kind: int,
    function: PickledFunction | None,
    options: PutOptions,
    size: int,
    limit: int,
    what: str,
    batches: int | None = None,
) -> list[PutBatch]:
    """Batches of messages that all share ``kind`` and ``function`` (one group per chunk).

    ``to_payloads(chunk)`` turns a chunk of ``sources`` into the objects to pickle (applied
    chunk by chunk, so only one chunk's payloads exist at a time); ``None`` pickles the
    sources themselves. ``what`` names a payload in errors (``"argument"``, ``"item"``).
    """
    digest = None if function is None else function.digest
    funcs = {} if function is None else {function.digest: function.data}

    def encode_chunk(positions: range) -> PutBatch:
        chunk = sources[positions.start : positions.stop]
        payloads = chunk if to_payloads is None else to_payloads(chunk)
        offsets, data = pack(payloads, positions, limit=limit, what=what)
        return PutBatch([options.group(kind, digest, len(positions), offsets, data)], funcs, [positions])

    return encode_chunks(len(sources), size, encode_chunk, batches=batches)


def _arguments(chunk: Sequence[Sequence[Any]]) -> list[Sequence[Any]]:
    return [t[1:] for t in chunk]


def encode_uniform(tasks: list[Any], options: PutOptions, *, size: int, limit: int,
                   batches: int | None = None) -> list[PutBatch] | None:
    """The fast path of ``batch_submit``: tasks ``(func, *args)`` that all call one function.

    Returns ``None`` when the tasks are anything else; the general path (:func:`encode_calls`
    after :func:`calls_from_tasks`) then validates them one by one.
    """
    try:
        funcs = {t[0] for t in tasks}
    except Exception:  # not subscriptable, empty, or an unhashable "function"
        return None
    if len(funcs) != 1:
        return None
    (func,) = funcs
    if not callable(func) or not all(isinstance(t, (tuple, list)) for t in tasks[:1]):
        return None
    return encode_payloads(tasks, _arguments, kind=Kind.CALL, function=pickle_function(func),
                           options=options, size=size, limit=limit, what="arguments", batches=batches)


def calls_from_tasks(tasks: Sequence[Any]) -> list[Call]:
    """``(func, args, None)`` of each task ``(func, *args)``; :class:`InvalidTaskError`
    naming the first task that is not a non-empty tuple or list."""
    calls: list[Call] = []
    for i, task in enumerate(tasks):
        if not isinstance(task, (tuple, list)) or not task:
            raise InvalidTaskError(f"task {i} must be a tuple (func, *args), got {task!r:.80}")
        calls.append((task[0], tuple(task[1:]), None))
    return calls


def encode_calls(calls: list[Call], options: PutOptions, *, size: int, limit: int,
                 batches: int | None = None) -> list[PutBatch]:
    """Batches of arbitrary calls: each chunk is grouped by kind and function, and each
    distinct function is pickled once per submission."""
    functions: dict[Any, PickledFunction] = {}
    single = len(calls) == 1
    return encode_chunks(
        len(calls), size,
        lambda positions: _encode_call_chunk(calls, positions, functions, options, limit, single),
        batches=batches,
    )


def _encode_call_chunk(
    calls: list[Call],
    positions: range,
    functions: dict[Any, PickledFunction],
    options: PutOptions,
    limit: int,
    single: bool,
) -> PutBatch:
    """One batch for ``calls[positions]``: one group per kind and function."""
    by_group: dict[tuple[int, bytes], tuple[list[int], list[Any]]] = {}
    funcs: dict[bytes, bytes] = {}
    for i in positions:
        func, args, kwargs = calls[i]
        fkey: Any = func if getattr(func, "__hash__", None) else id(func)
        pickled = functions.get(fkey)
        if pickled is None:
            pickled = functions[fkey] = pickle_function(func, index=None if single else i)
        funcs[pickled.digest] = pickled.data
        kind = Kind.CALL_KW if kwargs else Kind.CALL
        group_positions, payloads = by_group.setdefault((kind, pickled.digest), ([], []))
        group_positions.append(i)
        payloads.append((args, kwargs) if kwargs else args)
    groups, positions_per_group = [], []
    for (kind, digest), (group_positions, payloads) in by_group.items():
        offsets, data = pack(payloads, group_positions, limit=limit, what="arguments", single=single)
        groups.append(options.group(kind, digest, len(group_positions), offsets, data))
        positions_per_group.append(group_positions)
    return PutBatch(groups, funcs, positions_per_group)


def pack(
    payloads: Sequence[Any],
    positions: Sequence[int],
    *,
    limit: int,
    what: str,
    single: bool = False,
) -> tuple[bytes, bytes]:
    """Pickle ``payloads`` into one group's ``(offsets, data)``.

    Errors name the failing message by its input position (``positions[k]`` for the k-th
    payload; no position if ``single``, a one-message submission):
    :class:`SerializationError` (the pickling error as its cause) and
    :class:`PayloadTooLargeError` for a payload over ``limit`` bytes.
    """
    try:
        return pack_payloads(payloads, max_message_bytes=limit, what=what)
    except SerializationError as e:
        index = None if single or e.index is None else positions[e.index]
        cause = e.__cause__
        where = "" if index is None else f" of task {index}"
        raise SerializationError(
            f"cannot pickle the {what}{where}: {type(cause).__name__}: {cause}", index=index
        ) from cause
    except PayloadTooLargeError as e:
        index = None if single or e.index is None else positions[e.index]
        raise PayloadTooLargeError(e.size, e.limit, index=index) from None


def encode_keyed(
    keys: Sequence[str | None],
    route: Callable[[str | None], int],
    payload_of: Callable[[int], tuple[int, Any, Any]],
    options: PutOptions,
    *,
    size: int,
    limit: int,
    what: str,
) -> list[tuple[int, PutBatch]]:
    """Batches of messages that each carry their own routing key: message ``i`` goes to queue
    ``route(keys[i])``, as a put group of its key (one group per key, kind and function in
    each chunk of at most ``size`` messages of one queue), in input order within a key.

    ``payload_of(i)`` gives message ``i``'s ``(kind, function or None, payload)``; each
    distinct function is pickled once. Returns ``(queue, batch)`` pairs.
    """
    by_queue: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_queue.setdefault(route(key), []).append(i)
    functions: dict[Any, PickledFunction] = {}
    out = []
    for q, positions in by_queue.items():
        for lo in range(0, len(positions), size):
            chunk = positions[lo : lo + size]
            out.append((q, _encode_keyed_chunk(chunk, keys, payload_of, functions, options, limit, what)))
    return out


def _encode_keyed_chunk(chunk: list[int], keys: Sequence[str | None], payload_of: Callable[[int], tuple[int, Any, Any]],
                        functions: dict[Any, PickledFunction], options: PutOptions, limit: int, what: str) -> PutBatch:
    # One group per run of a key's messages with one kind and function: a key whose messages
    # alternate functions gets several groups, made (and so stored) in its put order.
    by_group: dict[tuple[str | None, int, bytes | None, int], tuple[list[int], list[Any]]] = {}
    last: dict[str | None, tuple[int, bytes | None, int]] = {}  # key -> (kind, digest, run)
    funcs: dict[bytes, bytes] = {}
    for i in chunk:
        kind, func, payload = payload_of(i)
        digest = None
        if func is not None:
            fkey: Any = func if getattr(func, "__hash__", None) else id(func)
            pickled = functions.get(fkey)
            if pickled is None:
                pickled = functions[fkey] = pickle_function(func, index=i)
            funcs[pickled.digest] = pickled.data
            digest = pickled.digest
        prev = last.get(keys[i])
        run = prev[2] if prev is not None and prev[:2] == (kind, digest) else (prev[2] + 1 if prev else 0)
        last[keys[i]] = (kind, digest, run)
        group_positions, payloads = by_group.setdefault((keys[i], kind, digest, run), ([], []))
        group_positions.append(i)
        payloads.append(payload)
    groups, positions = [], []
    for (key, kind, digest, _), (group_positions, payloads) in by_group.items():
        offsets, data = pack(payloads, group_positions, limit=limit, what=what)
        groups.append(replace(options, key=key).group(kind, digest, len(group_positions), offsets, data))
        positions.append(group_positions)
    return PutBatch(groups, funcs, positions)
