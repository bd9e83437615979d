"""Putting messages into a queue actor: decoding a put blob, refusing what the queue cannot
hold, remembering put tokens so a retried put is stored once, and waking the consumers.

A mixin of :class:`~daskqueue.queue.base.QueueActorBase` (see there why mixins). What a put
does to the message lifecycle is the pure core's (``QueueCore.new_chunk``, ``QueueCore.put``);
what storage does with it, the actor's hooks (``_fit_groups``, ``_on_put``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from array import array
from typing import TYPE_CHECKING, Any

from daskqueue.errors import PackedGroupRefusedError, PayloadTooLargeError, UnknownFunctionsError
from daskqueue.queue.payload import ChunkPayload, packed_payload, ranges_of
from daskqueue.serialize import decode_put

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore
    from daskqueue.queue.functions import FunctionTable

__all__ = ["PuttingMixin", "TOKENS_KEPT"]

#: How many recent put tokens a queue remembers, to answer a retried put (one whose answer
#: was lost when the queue moved) with the ids it already got instead of storing it again.
TOKENS_KEPT = 10_000


class PuttingMixin:
    """Remote method ``put_batch`` and its body ``_put_now``; the put tokens' bookkeeping."""

    # Owned by QueueActorBase (the storage hooks ``_fit_groups`` and ``_on_put`` too), the
    # gate, the sweeper, the outbox and the function table.
    index: int
    kind: str
    stores_packed: bool
    max_message_bytes: int
    _core: QueueCore
    _funcs: FunctionTable
    _tokens: dict[bytes, tuple[int, int]]
    _outcome_tokens: dict[bytes, None]
    _getters: int
    _paused: Any
    _reported_work: bool
    _unpaused: Any
    _start: Any
    _hear_producer: Any
    _fit_groups: Any
    _on_put: Any
    _sweep_functions_if_due: Any
    _reschedule: Any
    _notify_ready: Any
    _work_changed: Any

    async def _put_now(self, blob: bytes, token: bytes | None = None, producer: int = 0) -> list[tuple[int, int]]:
        """Enqueue a put blob; return ``(first_seq, count)`` per group of the blob, in order.

        ``put_batch``'s own body, never wrapped: a durable queue under ``fsync="always"``
        wraps the actor method ``put_batch`` so that its answer waits for the sync (an
        await), and callers that must act before any consumer can lease what they put
        (``adopt``, ``replay_dead``: the moved record of an attached producer goes first)
        call this instead; their own answers are wrapped and wait for the sync.

        ``producer`` (a tag, 0: the pool's owner) is the producer handle that reads these
        messages' outcomes; a group that names its own (a moved one) keeps it.

        A group that storage splits into several chunks still gets one range: its chunks are
        made one after the other, so their sequence numbers are consecutive. A put with the
        ``token`` of a put this queue stored already (a retry whose first answer was lost)
        stores nothing and gets the first one's answer.
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        funcs, groups = decode_put(blob)
        if producer:
            groups = [g if g.producer else dataclasses.replace(g, producer=producer) for g in groups]
            self._hear_producer(producer)
        if token is not None and token in self._tokens:
            return ranges_of(self._tokens[token], groups)
        new_funcs, unknown = self._funcs.to_store({g.digest for g in groups if g.digest is not None}, funcs)
        if unknown:  # evicted since the client sent them: it sends them again
            raise UnknownFunctionsError(sorted(unknown))
        for g in groups:
            self._check_group(g)
        now = self._now()
        chunks = []
        ranges = []
        for group in groups:
            first = None
            for g in self._fit_groups([group]) if not group.packed else [group]:
                chunk = self._core.new_chunk(
                    g.count, priority=g.priority, payload=_payload_of(g), meta=g.meta(), type=g.type, key=g.key,
                )
                chunks.append((chunk, g.delay_now()))
                first = chunk.base_seq if first is None else first
            ranges.append((first, group.count))
        self._on_put(chunks, new_funcs, now, token, ranges)  # raises (nothing enqueued) if storage fails
        self._remember_token(token, ranges)
        self._funcs.add(new_funcs)
        for chunk, delay_s in chunks:
            self._core.put(chunk, now=now, not_before=now + delay_s if delay_s > 0 else None)
        self._sweep_functions_if_due()  # after the put: its functions are in use
        if not self._reported_work or any(d > 0 for _, d in chunks):  # a load report, a due time
            self._reschedule()
        self._notify_ready()
        self._work_changed()
        return ranges

    async def put_batch(self, blob: bytes, token: bytes | None = None, producer: int = 0) -> list[tuple[int, int]]:
        """Enqueue a put blob; the actor method (see ``_put_now``, its body, for the contract)."""
        ranges = await self._put_now(blob, token, producer)
        if self._getters:
            # Long polls were waiting here: let them take the work before this answer is
            # written (after an idle gap the write takes 0.3-0.6 ms, and a consumer on this
            # worker would start the task only after it; the producer waits on the
            # outcome, not on this answer). Their wake-ups are already on the loop.
            await asyncio.sleep(0)
        return ranges

    def _check_group(self, g: Any) -> None:
        """Refuse a put group this queue cannot hold: a payload over ``max_message_bytes``
        (:class:`PayloadTooLargeError`; a packed blob counts whole: clients pack no more than
        the limit), a packed group where storage keeps one record per message
        (:class:`PackedGroupRefusedError`)."""
        if not g.packed:
            self._check_sizes(g.offsets)
            return
        if not self.stores_packed:
            raise PackedGroupRefusedError(self.index, self.kind)
        if len(g.data) > self.max_message_bytes:
            raise PayloadTooLargeError(len(g.data), self.max_message_bytes)

    def _check_sizes(self, offsets_bytes: bytes) -> None:
        offs = array("I")
        offs.frombytes(offsets_bytes)
        if len(offs) and offs[-1] - offs[0] > self.max_message_bytes:
            biggest = max(b - a for a, b in zip(offs, offs[1:]))
            if biggest > self.max_message_bytes:
                raise PayloadTooLargeError(biggest, self.max_message_bytes)

    def _remember_token(self, token: bytes | None, ranges: list[tuple[int, int]]) -> None:
        if token is None or not ranges:
            return
        self._tokens[token] = (ranges[0][0], sum(n for _, n in ranges))
        if len(self._tokens) > TOKENS_KEPT:  # dicts keep insertion order: drop the oldest
            del self._tokens[next(iter(self._tokens))]

    def _remember_outcome_token(self, token: bytes | None) -> None:
        if token is None:
            return
        self._outcome_tokens[token] = None
        if len(self._outcome_tokens) > TOKENS_KEPT:
            del self._outcome_tokens[next(iter(self._outcome_tokens))]


def _payload_of(g: Any) -> ChunkPayload:
    """The stored payload of put group ``g``."""
    if g.packed:
        return packed_payload(g.data, g.packed, g.first)
    offsets = array("I")
    offsets.frombytes(g.offsets)
    return ChunkPayload(offsets, g.data)
