"""Dead letters as the client lists them (``QueuePool.dead_letters()``)."""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

from daskqueue.messages import decode_error, make_id
from daskqueue.serialize import load_payload

__all__ = ["DeadLetter", "dead_letter_of"]

logger = logging.getLogger("daskqueue")


@dataclass(frozen=True)
class DeadLetter:
    """A dead-lettered message, as ``QueuePool.dead_letters()`` lists it.

    ``payload`` is what was put: for a task, ``(func, args, kwargs)``; for a raw item, the
    item (``None`` if it cannot be unpickled here, or was not kept: stores written before
    payloads were kept in dead letters). ``when`` is the wall-clock time it died.
    """

    task_id: int
    payload: Any
    error_type: str
    message: str
    traceback: str
    attempts: int
    when: datetime.datetime | None
    type: str | None = None
    key: str | None = None
    priority: int = 0

    def __repr__(self) -> str:
        return (f"DeadLetter(task_id={self.task_id}, {self.error_type}: {self.message[:80]!r}, "
                f"attempts={self.attempts})")


def dead_letter_of(q: int, row: tuple[Any, ...], funcs: dict[bytes, Any],
                   blobs: dict[int, Any] | None = None) -> DeadLetter:
    """A :class:`DeadLetter` from a queue's ``dead_letters`` row; ``funcs`` caches the
    unpickled functions by digest, ``blobs`` the packed blobs of the rows of one listing
    (see :func:`~daskqueue.serialize.load_payload`)."""
    from daskqueue.messages import Kind

    seq, attempts, error, wall, kind, digest, type_, key, priority, data = row
    exc_type, message, tb = decode_error(error)
    payload: Any = None
    if data is not None:
        try:
            value = load_payload(data, {} if blobs is None else blobs)
            if kind == Kind.RAW:
                payload = value
            else:
                func = funcs.get(digest) if digest is not None else None
                args, kwargs = value if kind == Kind.CALL_KW else (value, {})
                payload = (func, tuple(args), dict(kwargs))
        except Exception as e:  # shown, not raised: a listing must not fail on one message
            logger.debug("dead letter %d: payload not readable here: %s", make_id(q, seq), e)
    when = datetime.datetime.fromtimestamp(wall) if wall else None
    return DeadLetter(make_id(q, seq), payload, exc_type, message, tb, attempts, when, type_, key, priority)
