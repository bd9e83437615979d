"""The consumer that runs task messages (``QueuePool.submit`` / ``batch_submit`` / ``map``)."""

from __future__ import annotations

import functools
from typing import Any

from daskqueue.consumer.base import Batch, ConsumerBase, Outcome
from daskqueue.consumer.limits import run_limited
from daskqueue.errors import InvalidTaskError
from daskqueue.messages import Kind, Message, Task, error_from_exception
from daskqueue.producers import set_producer
from daskqueue.serialize import loads

__all__ = ["GeneralConsumer"]


class GeneralConsumer(ConsumerBase):
    """Runs each task message's function and records its return value or its error.

    A raw item (from ``put``/``put_many``) is not a task: it fails at once, without retries,
    with an :class:`~daskqueue.errors.InvalidTaskError`; use a ``ConsumerBase`` subclass for
    raw items. Subclasses that override :meth:`process_item` get the generic per-message path.
    """

    def process_item(self, message: Message) -> Any:
        if not isinstance(message.data, Task):
            raise InvalidTaskError(
                f"GeneralConsumer runs tasks; message {message.id} is a raw item "
                f"({type(message.data).__name__}). Use a ConsumerBase subclass for raw items."
            )
        return message.data()

    def run_batch(self, batch: Batch) -> Outcome:
        if type(self).process_item is not GeneralConsumer.process_item:
            return super().run_batch(batch)
        # The hot loop: no Message objects, one call per task and one loads per task (per
        # segment, of a packed one).
        results: list[Any] = []
        append = results.append
        errors: dict[int, bytes] = {}
        fatal: set[int] = set()
        pos = 0
        for seg in batch.segments:
            set_producer(seg.producer)  # follow-ups this span's tasks enqueue carry its producer
            try:
                if seg.kind == Kind.RAW:
                    raise InvalidTaskError("GeneralConsumer runs tasks; got a raw item. "
                                           "Use a ConsumerBase subclass for raw items.")
                func = self._payloads.function(seg.digest)
                # Unpickled once for the whole segment: if that fails, every task of it fails.
                values, one_argument = seg.unpacked() if seg.packed else (None, False)
            except Exception as e:
                error = error_from_exception(e)
                for _ in range(seg.count):
                    if self._halt_items:
                        return Outcome(pos, errors, fatal, results)
                    errors[pos] = error
                    if isinstance(e, InvalidTaskError):
                        fatal.add(pos)
                    append(None)
                    pos += 1
                continue
            limit = seg.time_limit_s
            if one_argument and not limit:  # the fastest path: map's
                for arg in values:  # type: ignore[union-attr]
                    if self._halt_items:
                        return Outcome(pos, errors, fatal, results)
                    try:
                        append(func(arg))
                    except Exception as e:
                        _failed(errors, fatal, pos, e)
                        append(None)
                    pos += 1
                continue
            if one_argument:
                values = [(x,) for x in values]  # type: ignore[union-attr]
            for payload in seg.payloads() if values is None else values:
                if self._halt_items:
                    return Outcome(pos, errors, fatal, results)
                try:
                    value = loads(payload) if values is None else payload
                    if limit:
                        args, kwargs = value if seg.kind == Kind.CALL_KW else (value, {})
                        append(run_limited(functools.partial(func, *args, **kwargs), limit))
                    elif seg.kind == Kind.CALL:
                        append(func(*value))
                    else:
                        args, kwargs = value
                        append(func(*args, **kwargs))
                except Exception as e:
                    _failed(errors, fatal, pos, e)
                    append(None)
                pos += 1
        return Outcome(pos, errors, fatal, results)


def _failed(errors: dict[int, bytes], fatal: set[int], pos: int, e: Exception) -> None:
    """Task ``pos`` raised ``e``: its error, and whether retrying it is pointless."""
    errors[pos] = error_from_exception(e)
    if isinstance(e, InvalidTaskError):
        fatal.add(pos)
