"""One put's way to a queue: where it goes, under which token, and when it goes again.

A mixin of :class:`~daskqueue.queue.sending.Sender`, which sends a submission's many puts at
once and records what they stored. Here is what happens to each one: it is sent under a
fresh token (with the functions its queue has not confirmed yet), to its queue or, when that
queue left the routing meanwhile (removed from another thread), to where the routing sends
it now; its answer is read, and the put is made again under the *same* token when the queue
moved (a queue that stored it already answers with the ids it gave, and stores nothing) or
evicted functions the put named (then carrying them). A failure that may have stored it, or
would fail again, is raised: a put is never made twice under two tokens.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from daskqueue import defaults
from daskqueue.errors import (
    PoolClosedError,
    QueueCallTimeoutError,
    QueueClosedError,
    QueueLostError,
    QueueMovedError,
    UnknownFunctionsError,
)
from daskqueue.queue.encode import PutBatch
from daskqueue.queue.interrupted import SentPut as _Put
from daskqueue.queue.router import Router
from daskqueue.queue.table import Pending, QueueTable
from daskqueue.segment.format import TOKEN_SIZE
from daskqueue.serialize import encode_put

__all__ = ["PutDelivery"]

logger = logging.getLogger("daskqueue")


class PutDelivery:
    """Sending one put and reading its answer (see the module docstring), for a pool's
    ``table`` and ``router``, tagged with its ``producer``."""

    table: QueueTable
    router: Router
    producer: int

    def _put_routed(self, q: int, put: _Put, reroute: str | None, hold: Callable[[int], None] | None) -> None:
        """Put ``put`` to queue ``q`` or, with ``reroute``, if ``q`` is out of routing (being
        removed), where the routing sends it now (:meth:`_rerouted`); its ``live`` tells
        where it went."""
        batch = put.batch
        for attempt in range(defaults.PUT_ATTEMPTS):
            if reroute and q not in self.router.targets:
                q = self._rerouted(batch, reroute)
                if hold is not None:
                    hold(q)
            try:
                self._put(q, put)
                return
            except Exception as e:
                if not (reroute and self._refused_for_removal(q, e)) or attempt == defaults.PUT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _refused_for_removal(self, q: int, e: Exception) -> bool:
        """Whether a put to ``q`` failed because ``q`` left the pool (closed once drained, or
        released): then it stored nothing and may go elsewhere. Any other failure (a
        timeout, a lost answer, a bad payload) may have stored it, or would fail again: it
        is raised, never put twice under a new token."""
        if q in self.router.targets or isinstance(e, (QueueCallTimeoutError, PoolClosedError)):
            return False
        return isinstance(e, QueueClosedError) or (q in self.table.removed and isinstance(e, QueueLostError))

    def _rerouted(self, batch: PutBatch, reroute: str) -> int:
        """Where the routing sends ``batch`` now: the next queue in turn (``"next"``), or the
        queue of its messages' type or key (``"route"``: every group of a batch routed to
        one queue shares them)."""
        if reroute == "route":
            group = batch[0][0]
            q = self.router.route(group.type, group.key)
            if q is not None:
                return q
        return self.router.next_target()

    def _answer_routed(self, put: _Put, reroute: str | None, hold: Callable[[int], None] | None,
                       deadline: float | None = None) -> tuple[int, Any]:
        """The queue that stored ``put`` and its answer (``(first seq, count)`` per group).
        With ``reroute``, a put refused by a queue taken out of routing meanwhile (closed once
        drained, or released: either way it stored nothing; see :meth:`_refused_for_removal`)
        is put where the routing sends it now (``put.live`` follows it)."""
        groups, funcs, _ = put.batch
        q, blob, token, pending = put.live  # type: ignore[misc]
        if pending is None:  # interrupted as it went out: again, under its token
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueCallTimeoutError(q, "put_batch", 0.0)  # not sent again: unknown
            pending = self.table.call(q, "put_batch", *self._put_args(blob, token))
            put.live = (q, blob, token, pending)
        for attempt in range(defaults.PUT_ATTEMPTS):
            try:
                try:
                    return q, self._put_answer(q, pending, blob, token, deadline)
                except UnknownFunctionsError as e:  # the queue evicted them: once more, carrying them
                    for digest in e.digests:
                        self.table.sent_funcs[q].discard(digest)
                    blob = encode_put(groups, funcs)
                    put.live = (q, blob, token, None)
                    pending = self.table.call(q, "put_batch", *self._put_args(blob, token))
                    put.live = (q, blob, token, pending)
                    return q, self._put_answer(q, pending, blob, token, deadline)
            except Exception as e:
                if not (reroute and self._refused_for_removal(q, e)) or attempt == defaults.PUT_ATTEMPTS - 1:
                    raise
                logger.info("queue %d left the routing while a put to it was in flight (%s: %s); "
                            "putting it to the next queue", q, type(e).__name__, e)
                self._put_routed(q, put, reroute, hold)
                q, blob, token, pending = put.live  # type: ignore[misc]
        raise AssertionError("unreachable")

    def _put(self, q: int, put: _Put) -> None:
        """Send ``put`` to queue ``q`` under a new token, noted in ``put.live`` before it goes out."""
        groups, funcs, _ = put.batch
        # A function confirmed at a queue is not sent to it again.
        sent = self.table.sent_funcs[q]
        blob = encode_put(groups, sent.unsent(funcs))
        token = os.urandom(TOKEN_SIZE)
        put.live = (q, blob, token, None)
        put.live = (q, blob, token, self.table.call(q, "put_batch", *self._put_args(blob, token)))

    def _put_args(self, blob: bytes, token: bytes) -> tuple[Any, ...]:
        """A put's arguments; the owner's keep their old form."""
        return (blob, token, self.producer) if self.producer else (blob, token)

    def _put_answer(self, q: int, pending: Pending, blob: bytes, token: bytes, deadline: float | None = None) -> Any:
        """The answer to a put; if the queue moved meanwhile (its answer may be lost), the same
        put again where it moved, with the same token: a queue that stored it already answers
        with the ids it gave and stores nothing, so the put is neither lost nor stored twice.
        Each wait ends by ``deadline`` if given; past it, a move is not awaited."""
        for _ in range(defaults.PUT_ATTEMPTS - 1):
            try:
                return self.table.answer(q, pending, deadline)
            except QueueMovedError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                self.table.await_move(q, pending.handle)
                logger.info("queue %d moved while a put was in flight; putting again there", q)
                pending = self.table.call(q, "put_batch", *self._put_args(blob, token))
        return self.table.answer(q, pending, deadline)
