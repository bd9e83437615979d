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
        # The hot loop: no Message objects, one loads and one call per task.
        results: list[Any] = []
        append = results.append
        errors: dict[int, bytes] = {}
        fatal: set[int] = set()
        pos = 0
        for seg in batch.segments:
            set_producer(seg.producer)  # follow-ups this span's tasks enqueue carry its producer
            try:
                func = None if seg.kind == Kind.RAW else self._function(seg.digest)
            except Exception as e:
                error = error_from_exception(e)
                for _ in range(seg.count):
                    if self._halt_items:
                        return Outcome(pos, errors, fatal, results)
                    errors[pos] = error
                    append(None)
                    pos += 1
                continue
            limit = seg.time_limit_s
            for payload in seg.payloads():
                if self._halt_items:
                    return Outcome(pos, errors, fatal, results)
                try:
                    if limit and seg.kind != Kind.RAW:
                        args, kwargs = loads(payload) if seg.kind == Kind.CALL_KW else (loads(payload), {})
                        append(run_limited(functools.partial(func, *args, **kwargs), limit))  # type: ignore[arg-type]
                    elif seg.kind == Kind.CALL:
                        append(func(*loads(payload)))  # type: ignore[misc]
                    elif seg.kind == Kind.CALL_KW:
                        args, kwargs = loads(payload)
                        append(func(*args, **kwargs))  # type: ignore[misc]
                    else:
                        raise InvalidTaskError(
                            "GeneralConsumer runs tasks; got a raw item. "
                            "Use a ConsumerBase subclass for raw items."
                        )
                except Exception as e:
                    errors[pos] = error_from_exception(e)
                    if isinstance(e, InvalidTaskError):
                        fatal.add(pos)
                    append(None)
                pos += 1
        return Outcome(pos, errors, fatal, results)
