"""A queue's function table: the pickled task functions its messages name, by digest.

Pure (no Dask, no clock, no I/O). Functions are evicted by mark and sweep, not by reference
counts: a count would have to stay right through put, settle, retry, dead-letter, replay,
purge, move, adopt, hand-off and restore, while the set of digests in use is one pass over the
queue's live messages and dead letters (:meth:`FunctionTable.sweep`, given that set).

Two tables: ``held``, which holds every function a live message or dead letter of the queue
uses (the invariant the queue keeps: a put adds its functions before its messages; a sweep
keeps the referenced ones), and ``idle``, the newest :data:`~daskqueue.defaults.QUEUE_IDLE_FUNCTIONS`
functions a sweep found unused, so that a function used again soon need not be sent again.
A put naming a function the queue holds in neither table, and not carrying it, is refused
(:meth:`FunctionTable.unknown`, :class:`~daskqueue.errors.UnknownFunctionsError`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from daskqueue import defaults

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore

__all__ = ["FunctionTable", "FunctionsMixin"]

logger = logging.getLogger("daskqueue")


class FunctionTable:
    """``digest -> pickled function``, in ``held`` (in use, never evicted) or ``idle`` (LRU).

    Reads (``in``, ``[d]``, :meth:`get`, :meth:`lookup`) look in both tables."""

    def __init__(self, *, sweep_min: int = defaults.QUEUE_FUNCTION_SWEEP_MIN,
                 idle_max: int = defaults.QUEUE_IDLE_FUNCTIONS) -> None:
        self.held: dict[bytes, bytes] = {}
        # Oldest first. Not a daskqueue.lru.LRU: a hand-off exports its entries, and the
        # queue's event loop is its only user (no lock needed).
        self._idle: OrderedDict[bytes, bytes] = OrderedDict()
        self._idle_max = idle_max
        self.sweep_min = sweep_min
        self._size_at_sweep = 0  # len(held) after the last sweep

    def __repr__(self) -> str:
        return f"<FunctionTable: {len(self.held)} held, {len(self._idle)} idle>"

    def __contains__(self, digest: object) -> bool:
        return digest in self.held or digest in self._idle

    def __getitem__(self, digest: bytes) -> bytes:
        data = self.get(digest)
        if data is None:
            raise KeyError(digest)
        return data

    def __iter__(self) -> Iterator[bytes]:
        yield from list(self.held)

    def __len__(self) -> int:
        return len(self.held) + len(self._idle)

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    def get(self, digest: bytes) -> bytes | None:
        data = self.held.get(digest)
        if data is None:
            data = self._idle.get(digest)
            if data is not None:
                self._idle.move_to_end(digest)  # used again: the newest idle one
        return data

    def lookup(self, digests: Iterable[bytes]) -> dict[bytes, bytes]:
        """The functions of these digests that either table holds."""
        out = {}
        for d in digests:
            data = self.get(d)
            if data is not None:
                out[d] = data
        return out

    def to_store(self, named: Iterable[bytes], carried: dict[bytes, bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
        """For a put naming the digests ``named`` and carrying ``carried``: the functions to
        make held (carried ones not held, and idle ones it names without carrying, which come
        back), and the digests it names that neither it nor the table has (the put must be
        refused). Changes nothing: :meth:`add` the first once the put is stored."""
        new = {d: data for d, data in carried.items() if d not in self.held}
        unknown = []
        for d in named:
            if d in self.held or d in new:
                continue
            data = self._idle.get(d)
            if data is None:
                unknown.append(d)
            else:
                new[d] = data
        return new, unknown

    def add(self, funcs: dict[bytes, bytes]) -> None:
        """Hold ``funcs`` (a put that uses them was stored)."""
        for d, data in funcs.items():
            self.held[d] = data
            self._idle.pop(d, None)

    def sweep_due(self) -> bool:
        """Whether ``held`` has doubled since the last sweep and is past ``sweep_min``."""
        n = len(self.held)
        return n > self.sweep_min and n >= 2 * self._size_at_sweep

    def sweep(self, referenced: set[bytes]) -> dict[bytes, bytes]:
        """Move every held function whose digest is not ``referenced`` to ``idle`` (the
        oldest idle ones are forgotten past its bound); return those moved."""
        dropped = {d: data for d, data in self.held.items() if d not in referenced}
        for d, data in dropped.items():
            del self.held[d]
            self._idle[d] = data
        while len(self._idle) > self._idle_max:
            self._idle.popitem(last=False)
        self._size_at_sweep = len(self.held)
        return dropped

    def load(self, funcs: dict[bytes, bytes]) -> None:
        """Hold ``funcs`` in place of everything (a hand-off's state); the next due sweep
        sorts out the unused ones."""
        self.held = dict(funcs)
        self._idle.clear()
        self._size_at_sweep = 0

    def export(self) -> dict[bytes, bytes]:
        """Every function of both tables (a hand-off's successor holds them all)."""
        out = dict(self._idle)
        out.update(self.held)
        return out


class FunctionsMixin:
    """Remote method ``get_functions``; the sweep of the queue actor's :class:`FunctionTable`
    (a mixin of :class:`~daskqueue.queue.base.QueueActorBase`)."""

    # Owned by QueueActorBase and GateMixin.
    index: int
    _core: QueueCore
    _funcs: FunctionTable
    _paused: Any
    _handed_off: bool

    async def get_functions(self, digests: list[bytes]) -> dict[bytes, bytes]:
        """The pickled functions with these digests (those this queue holds, used or idle).
        Those of its leased messages it always holds: a consumer's fetch cannot miss."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()  # type: ignore[attr-defined]
        if self._handed_off:
            self._check_serving()  # type: ignore[attr-defined]
        return self._funcs.lookup(digests)

    def _sweep_functions_if_due(self) -> None:
        """At a put and from the sweeper: sweep once the table has doubled (amortised)."""
        if self._funcs.sweep_due():
            self._sweep_functions()

    def _sweep_functions(self) -> None:
        """Mark and sweep: the functions no live message (ready, delayed, leased, moving)
        and no dead letter uses go to the idle table. O(spans + dead letters)."""
        used = {getattr(span.chunk.meta, "digest", None) for span, _ in self._core.live_spans()}
        used.update(getattr(d.chunk.meta, "digest", None) for d in self._core.dead)
        used.discard(None)
        dropped = self._funcs.sweep(used)  # type: ignore[arg-type]
        if dropped:
            logger.debug("queue %d: %d unused functions moved to the idle table", self.index, len(dropped))
            self._functions_swept(dropped)

    def _functions_swept(self, dropped: dict[bytes, bytes]) -> None:
        """Storage hook: the functions a sweep moved to the idle table (a durable queue lets
        their FUNC records go at its next compaction)."""
