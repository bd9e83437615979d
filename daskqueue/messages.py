"""Message value types, message ids, and how errors travel as bytes."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Callable

__all__ = [
    "Kind",
    "Message",
    "Task",
    "make_id",
    "split_id",
    "id_range",
    "queue_base",
    "encode_error",
    "decode_error",
    "killed_error",
    "QUEUE_INDEX_BITS",
    "SEQ_BITS",
    "MAX_QUEUES",
    "MAX_SEQ",
]

#: A message id is ``queue_base(queue_index) + seq``: unique within a pool. Consecutive
#: messages of one queue have consecutive ids, and each queue's ids start at a base of its
#: own, spread so that the ids of different queues fall on different slots of a hash table.
#: (The layout before, ``seq << 16 | queue_index``, gave a dict or set of one batch's ids
#: only 2**(k-16) distinct first slots out of 2**k: filing a million results in a dict cost
#: 3.8 times as much as for consecutive ints, and every lookup of an id 3.2 times.)
SEQ_BITS = 47
QUEUE_INDEX_BITS = 16
MAX_QUEUES = 1 << QUEUE_INDEX_BITS
#: Seqs of one queue stay below this (7e13 messages in a queue's life); every id is below
#: 2**63, so it fits a signed 64-bit column.
MAX_SEQ = 1 << 46
_SPREAD_MASK = (1 << 45) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # odd: q -> q * _GOLDEN mod 2**k is one-to-one for every k


def queue_base(queue_index: int) -> int:
    """The id of seq 0 of queue ``queue_index``: the queue index above bit ``SEQ_BITS``,
    plus a spread below 2**45 (not 0 for queue 0 either: an id is never its seq, so code
    that mixes the two up fails in one-queue tests too), so ids of two queues never meet."""
    return (queue_index << SEQ_BITS) + ((queue_index + 1) * _GOLDEN & _SPREAD_MASK)


def make_id(queue_index: int, seq: int) -> int:
    """The pool-wide id of message ``seq`` of queue ``queue_index``."""
    return (queue_index << SEQ_BITS) + ((queue_index + 1) * _GOLDEN & _SPREAD_MASK) + seq


def split_id(message_id: int) -> tuple[int, int]:
    """``(queue_index, seq)`` of a message id."""
    q = message_id >> SEQ_BITS
    return q, message_id - (q << SEQ_BITS) - ((q + 1) * _GOLDEN & _SPREAD_MASK)


def id_range(queue_index: int, first_seq: int, count: int) -> range:
    """The ids of messages ``first_seq .. first_seq + count`` of queue ``queue_index``."""
    first = make_id(queue_index, first_seq)
    return range(first, first + count)


class Kind(IntEnum):
    """What a message's payload holds."""

    RAW = 0  #: one pickled item, for custom consumers (``put`` / ``put_many``)
    CALL = 1  #: a pickled ``args`` tuple; the function is named by digest in the group
    CALL_KW = 2  #: a pickled ``(args, kwargs)`` pair


@dataclass(frozen=True, slots=True)
class Task:
    """A function call carried by a task message; calling it runs the function."""

    func: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None

    def __call__(self) -> Any:
        if self.kwargs:
            return self.func(*self.args, **self.kwargs)
        return self.func(*self.args)


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered message, as ``ConsumerBase.process_item`` receives it.

    ``data`` is the item given to ``put``/``put_many``, or a :class:`Task` for a task message.
    ``attempts`` counts earlier deliveries that failed or whose lease expired.
    """

    id: int
    data: Any
    type: str | None = None
    priority: int = 0
    key: str | None = None
    attempts: int = 0


_SEP = "\x00"


def encode_error(exc_type: str, message: str, remote_traceback: str) -> bytes:
    """Pack an error as UTF-8 ``type NUL message NUL traceback``: always encodable."""
    parts = (exc_type, message, remote_traceback)
    return _SEP.join(p.replace(_SEP, " ") for p in parts).encode("utf-8", "replace")


def error_from_exception(exc: BaseException) -> bytes:
    """Encode ``exc`` with its traceback, as raised in the current thread."""
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not hide the failure
        text = f"<unprintable {name}>"
    tb = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
    return encode_error(name, text, tb)


def killed_error(what_died: str) -> bytes:
    """The error recorded for a message whose run ended with the death of its process
    (``what_died`` says which and how); its ``exc_type`` names
    :class:`~daskqueue.errors.KilledWorkerError`."""
    name = "daskqueue.errors.KilledWorkerError"
    text = (f"{what_died}: the task called os._exit, crashed the interpreter, or was killed "
            "(OOM killer, a signal), or the worker was lost")
    return encode_error(name, text, f"{name}: {text}\n")


def decode_error(blob: bytes) -> tuple[str, str, str]:
    """``(exc_type, message, traceback)`` from ``encode_error`` bytes."""
    parts = blob.decode("utf-8", "replace").split(_SEP, 2)
    parts += [""] * (3 - len(parts))
    return parts[0], parts[1], parts[2]
