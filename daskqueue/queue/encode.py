"""Encoding a submission into put batches: pure functions, no Dask, no I/O.

A call of ``submit``/``batch_submit``/``map``/``put_many`` becomes a list of :class:`PutBatch`,
one per ``put_batch`` call: its messages cut into chunks of consecutive input positions
(:func:`encode_chunks`, the one chunk loop), each chunk's messages grouped by kind and
function and their payloads pickled into one blob per group (:func:`pack`), or, for a
memory pool, packed: one pickle of the list of the payloads of at most
``PACK_MAX_MESSAGES`` messages per group while they pickle small (:class:`Packer`, see
:mod:`daskqueue.serialize`). ``batch_submit``, ``put_many`` and ``submit`` encode
everything before anything is sent, so a bad task enqueues nothing; ``map`` sends each
batch as soon as it is encoded (:class:`LazyBatches`).

This is the submit hot path: the work per message is a part of one pickle (one pickle of
its own where payloads are not packed) and, for mixed calls, one dict look-up; everything
else is per chunk or per group.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from daskqueue.errors import DaskQueueError, InvalidTaskError
from daskqueue.messages import Kind
from daskqueue.queue.router import even_ranges
from daskqueue.queue.packing import Packer, pack, pack_bound
from daskqueue.serialize import Group, PickledFunction, pickle_function
from daskqueue.validate import check_label

__all__ = [
    "PutOptions",
    "PutBatch",
    "Call",
    "chunk_size",
    "encode_chunks",
    "LazyBatches",
    "Packer",
    "pack_bound",
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

    def group(self, kind: int, digest: bytes | None, count: int, offsets: bytes, data: bytes,
              packed: int = 0) -> Group:
        """A put group of ``count`` messages with these options (``packed``: ``data`` is one
        pickle of the list of their ``count`` payloads, see :class:`Group`)."""
        return Group(kind, digest, self.type, self.priority, self.key, self.delay_s, count, offsets, data,
                     self.due_epoch, self.time_limit_s, 0, packed)


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


def chunk_ranges(n: int, size: int, batches: int | None = None) -> list[range]:
    """Consecutive ranges of at most ``size`` of the positions ``0 .. n``, in order; with
    ``batches``, that many ranges instead, of sizes that differ by at most one (the router's
    plan, so that each queue gets as many messages as the others)."""
    if batches is not None:
        return list(even_ranges(n, batches))
    return [range(lo, min(lo + size, n)) for lo in range(0, n, size)]


def encode_chunks(n: int, size: int, encode_chunk: Callable[[range], PutBatch], *,
                  batches: int | None = None, lazy: bool = False) -> list[PutBatch] | LazyBatches:
    """The chunk loop: ``encode_chunk(positions)`` for each of :func:`chunk_ranges`, in order
    (with ``lazy``, as the caller iterates: a :class:`LazyBatches`)."""
    ranges = chunk_ranges(n, size, batches)
    if lazy:
        return LazyBatches(ranges, encode_chunk)
    return [encode_chunk(r) for r in ranges]


class LazyBatches:
    """A submission's batches, each encoded when iteration reaches it, so that the sender
    puts the first while the next are encoded. Sized (the router plans the queues first).

    A batch that fails to encode (an argument that cannot be pickled, one too large) ends
    the iteration quietly: the sender then reads the answers of what it sent, as after any
    failure, and the caller raises ``error`` (:meth:`raise_error`). ``encoded`` counts the
    messages of the batches handed out, the positions ``0 .. encoded`` (ranges are in order).
    Iterate once, on one thread.
    """

    def __init__(self, ranges: list[range], encode_chunk: Callable[[range], PutBatch]) -> None:
        self.ranges = ranges
        self._encode_chunk = encode_chunk
        self._first: PutBatch | None = None
        self.encoded = 0
        self.error: DaskQueueError | None = None

    def __len__(self) -> int:
        return len(self.ranges)

    def __iter__(self) -> Iterator[PutBatch]:
        for k, positions in enumerate(self.ranges):
            try:
                batch = self._first if k == 0 and self._first is not None else self._encode_chunk(positions)
            except DaskQueueError as e:  # InvalidTaskError, SerializationError, PayloadTooLargeError
                self.error = e
                return
            self._first = None
            self.encoded = positions.stop
            yield batch

    def first(self) -> LazyBatches:
        """Encode the first batch now: an error raises here, before anything is sent (so a
        submission whose items all share a flaw fails with nothing sent). Returns self."""
        if self.ranges and self._first is None:
            self._first = self._encode_chunk(self.ranges[0])
        return self

    def raise_error(self) -> None:
        """Raise the error that ended the iteration, if any."""
        if self.error is not None:
            raise self.error


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
    pack_max_bytes: int = 0,
    lazy: bool = False,
    one_argument: bool = False,
) -> list[PutBatch] | LazyBatches:
    """Batches of messages that all share ``kind`` and ``function`` (one group per chunk, or
    several packed ones with ``pack_max_bytes``, see :func:`pack_bound`).

    ``to_payloads(chunk)`` turns a chunk of ``sources`` into the objects to pickle (applied
    chunk by chunk, so only one chunk's payloads exist at a time); ``None`` pickles the
    sources themselves. ``what`` names a payload in errors (``"argument"``, ``"item"``).
    ``lazy``: a :class:`LazyBatches`, each chunk encoded as it is sent. ``one_argument``:
    each payload is ``(x,)`` of its (transformed) source ``x``, the one argument of a call.
    """
    digest = None if function is None else function.digest
    funcs = {} if function is None else {function.digest: function.data}
    packer = Packer(pack_max_bytes)

    def encode_chunk(positions: range) -> PutBatch:
        chunk = sources[positions.start : positions.stop]
        payloads = chunk if to_payloads is None else to_payloads(chunk)
        pieces = packer.pieces(payloads, positions, limit=limit, what=what, one_argument=one_argument)
        return PutBatch([options.group(kind, digest, len(p.positions), p.offsets, p.data, p.packed) for p in pieces],
                        funcs, [p.positions for p in pieces])

    return encode_chunks(len(sources), size, encode_chunk, batches=batches, lazy=lazy)


_arguments = operator.itemgetter(slice(1, None))  # task -> its arguments (``t[1:]``)
_argument = operator.itemgetter(1)  # a one-argument task -> its argument
_function = operator.itemgetter(0)


def _one_argument_tasks(tasks: list[Any]) -> bool:
    """Whether every task is a plain tuple ``(func, x)``: their payloads ``(x,)`` are then
    packed as the bare arguments, as ``map``'s are (no tuple per task on either side)."""
    n = len(tasks)  # list.count finds the cached 2 and the tuple type by identity: C speed
    return list(map(len, tasks)).count(2) == n and list(map(type, tasks)).count(tuple) == n


def _pairs_of_one_function(tasks: list[Any]) -> Any:
    """The function of tasks that are all plain tuples ``(func, x)`` of one function, else
    None. Two passes in C: ``dict`` takes each task as a key-value pair (it refuses any of
    another length) and keeps a single key for equal functions (a pass for the functions
    and one for the lengths cost twice as much), and one for the types (a tuple yields, as
    ``dict`` reads it, what indexing reads). A function that cannot be hashed gives None
    (the general check follows)."""
    try:
        by_function = dict(tasks)
    except Exception:  # not pairs, an unhashable function, or one whose == raises
        return None
    if len(by_function) != 1 or list(map(type, tasks)).count(tuple) != len(tasks):
        return None
    return next(iter(by_function))


def _functions_differ(tasks: list[Any]) -> bool:
    """Whether five tasks spread over ``tasks`` (the first, the last, three between) show
    that they do not all call one function: known in a few steps, where the checks below
    take two passes over every task (and a dict) to find it. Compared as those checks compare
    (``list.count``: identity, then ``task[0] == first``); an error (no task, a task with no
    ``[0]``, an ``==`` that raises) answers True, as those checks then find no one function."""
    try:
        first = tasks[0][0]
        last = len(tasks) - 1
        return any(f is not first and not f == first for f in (tasks[last * k // 4][0] for k in (4, 2, 1, 3)))
    except Exception:
        return True


def encode_uniform(tasks: list[Any], options: PutOptions, *, size: int, limit: int,
                   batches: int | None = None, pack_max_bytes: int = 0) -> list[PutBatch] | None:
    """The fast path of ``batch_submit``: tasks ``(func, *args)`` that all call one function.

    Returns ``None`` when the tasks are anything else; the general path (:func:`encode_calls`
    after :func:`calls_from_tasks`) then validates them one by one. The arguments are read
    chunk by chunk by C-level getters (a comprehension per task cost as much as the pickling).
    """
    if _functions_differ(tasks):  # mixed functions, most often seen here: no pass over them all
        return None
    func = _pairs_of_one_function(tasks)
    one = func is not None
    if not one:
        try:
            funcs = list(map(_function, tasks))
            if not funcs or funcs.count(funcs[0]) != len(funcs):
                return None
        except Exception:  # not subscriptable, empty, or a "function" whose == raises
            return None
        func = funcs[0]
        del funcs
        if not all(isinstance(t, (tuple, list)) for t in tasks[:1]):
            return None
        one = _one_argument_tasks(tasks)
    if not callable(func):
        return None
    return encode_payloads(tasks, (lambda chunk: list(map(_argument if one else _arguments, chunk))),
                           kind=Kind.CALL, function=pickle_function(func), options=options, size=size,
                           limit=limit, what="arguments", batches=batches, pack_max_bytes=pack_max_bytes,
                           one_argument=one)  # type: ignore[return-value]


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
                 batches: int | None = None, pack_max_bytes: int = 0) -> list[PutBatch]:
    """Batches of arbitrary calls: each chunk is grouped by kind and function (packed
    groups with ``pack_max_bytes``, see :func:`pack_bound`), and each distinct function is
    pickled once per submission."""
    functions: dict[Any, PickledFunction] = {}
    single = len(calls) == 1
    packer = Packer(pack_max_bytes)
    return encode_chunks(  # type: ignore[return-value]
        len(calls), size,
        lambda positions: _encode_call_chunk(calls, positions, functions, options, limit, single, packer),
        batches=batches,
    )


def _encode_call_chunk(
    calls: list[Call],
    positions: range,
    functions: dict[Any, PickledFunction],
    options: PutOptions,
    limit: int,
    single: bool,
    packer: Packer,
) -> PutBatch:
    """One batch for ``calls[positions]``: one group per kind and function (or several
    packed ones)."""
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
        for p in packer.pieces(payloads, group_positions, limit=limit, what="arguments", single=single):
            groups.append(options.group(kind, digest, len(p.positions), p.offsets, p.data, p.packed))
            positions_per_group.append(p.positions)
    return PutBatch(groups, funcs, positions_per_group)


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
