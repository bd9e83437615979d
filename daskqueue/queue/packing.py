"""How the payloads of one put group are pickled: one pickle per message (:func:`pack`), or
packed, one pickle of many messages' payloads (:class:`Packer`; the format is in
:mod:`daskqueue.serialize`). Pure functions and one small stateful class: no Dask, no I/O.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from daskqueue.errors import PayloadTooLargeError, SerializationError
from daskqueue.serialize import PACK_MAX_BYTES, PACK_MAX_MESSAGES, pack_list, pack_payloads

__all__ = ["pack", "pack_bound", "Piece", "Packer", "MIN_PACK_MESSAGES"]


def pack_bound(n: int, options: Any, limit: int, *, durable: bool) -> int:
    """The largest packed blob for a submission of ``n`` messages (0: one pickle per
    message): memory pools pack; durable queues store one record per message; a keyed
    submission's messages are leased one at a time (a lease would unpickle its whole group
    for one message); one message gains nothing."""
    if durable or options.key is not None or n < 2:
        return 0
    return min(PACK_MAX_BYTES, limit)


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


class Piece(NamedTuple):
    """The messages of one put group: their input positions and their payloads' pickles."""

    positions: Sequence[int]
    packed: int  # 0: ``offsets`` delimit one pickle per message in ``data``; else the count packed in ``data``
    offsets: bytes
    data: bytes


#: The fewest messages a packed group is tried with: below that, one pickle per message
#: costs little more.
MIN_PACK_MESSAGES = 16


class Packer:
    """Pickles the payloads of one submission's put groups (:meth:`pieces`): packed in
    groups of up to ``PACK_MAX_MESSAGES`` while a group's pickle stays within ``max_bytes``,
    else one pickle per message.

    The group size adapts: halved after a group that pickled too large, doubled back after
    one that pickled small; a group that fails at the fewest messages, or an object plain
    pickle cannot pickle (a lambda: cloudpickle's, per message), ends packing for the rest
    of the submission. A try that fails costs at most about ``max_bytes`` of pickling (it
    stops there). Not thread-safe: one per submission.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = PACK_MAX_MESSAGES

    def pieces(self, payloads: Sequence[Any], positions: Sequence[int], *, limit: int, what: str,
               single: bool = False, one_argument: bool = False) -> list[Piece]:
        """The put groups of these payloads (those of one chunk, one kind and function).
        ``one_argument``: ``payloads`` are the arguments of one-argument calls, whose
        payloads are ``(argument,)`` (packed without the tuples, see ``pack_list``)."""
        out: list[Piece] = []
        lo, n = 0, len(payloads)
        while lo < n and self.max_bytes:
            hi = min(n, lo + self.size)
            part = payloads[lo:hi]
            try:
                blob = pack_list(part, max_bytes=self.max_bytes, one_argument=one_argument)
            except Exception:  # plain pickle cannot: per message, where the error is named
                self.max_bytes = 0
                break
            if blob is None:
                if self.size <= MIN_PACK_MESSAGES:
                    self.max_bytes = 0
                    break
                self.size = max(MIN_PACK_MESSAGES, self.size // 2)
                out.append(_per_message(part, positions[lo:hi], limit, what, single, one_argument))
            else:
                if len(blob) * 4 <= self.max_bytes and self.size < PACK_MAX_MESSAGES:
                    self.size = min(PACK_MAX_MESSAGES, self.size * 2)
                out.append(Piece(positions[lo:hi], hi - lo, b"", blob))
            lo = hi
        if lo < n:
            rest = payloads if lo == 0 else payloads[lo:]
            out.append(_per_message(rest, positions[lo:], limit, what, single, one_argument))
        return out


def _per_message(payloads: Sequence[Any], positions: Sequence[int], limit: int, what: str, single: bool,
                 one_argument: bool) -> Piece:
    """A group of these payloads, one pickle each."""
    offsets, data = pack([(x,) for x in payloads] if one_argument else payloads, positions,
                         limit=limit, what=what, single=single)
    return Piece(positions, 0, offsets, data)
