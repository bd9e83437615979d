"""A durable queue's syncs, off its event loop: started from the loop, run on the segment
store's sync thread (``SegmentStore.sync_soon``), awaited where a contract needs them.

On NFS or Lustre one fsync can take seconds; on the loop it would freeze the worker's
heartbeats and every actor there. Here only the sync thread waits. The contract stays: under
``fsync="always"`` a call that wrote is answered only once its writes are synced
(:func:`answers_when_durable`); syncs run in the order started; ``close`` waits for them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Awaitable, Callable, TypeVar

from daskqueue.segment.store import SegmentStore

__all__ = ["LoopSyncs", "answers_when_durable"]

logger = logging.getLogger("daskqueue")

C = TypeVar("C", bound=type)


class LoopSyncs:
    """The syncs of one store, as the owner's event loop sees them. Loop thread only."""

    def __init__(self, store: SegmentStore) -> None:
        self._store = store
        self._last: asyncio.Future[None] | None = None  # the latest sync started

    def start(self, *, index_only: bool = False) -> None:
        """Start a sync of everything written so far; off a loop (recovery, in ``__init__``),
        sync here and now."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._store.sync()
            return
        last = self._last = asyncio.wrap_future(self._store.sync_soon(index_only=index_only))
        # A sync nobody awaits (the sweeper's, a reclaim) still reports its failure; the store
        # refuses every later write after one, so the next call raises too.
        last.add_done_callback(_log_failure)

    async def durable(self) -> None:
        """Under ``always``: return once everything written so far is synced (raise what the
        sync raised). Otherwise return at once."""
        if self._store.fsync != "always":
            return
        if self._store.unsynced:
            self.start()
        if self._last is not None:
            await asyncio.shield(self._last)

    async def idle(self) -> None:
        """Return once every sync started has ended, whatever its outcome."""
        if self._last is not None:
            await asyncio.wait({self._last})


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.debug("sync failed: %s", future.exception())


def answers_when_durable(*names: str) -> Callable[[C], C]:
    """Class decorator: wrap the actor methods ``names`` (inherited or not), which may write,
    so that under ``fsync="always"`` each answer waits for the sync of what it wrote (on the
    sync thread: the loop stays free). The instance has a :class:`LoopSyncs` as ``_syncs``."""

    def decorate(cls: C) -> C:
        for name in names:
            setattr(cls, name, _answered_when_durable(getattr(cls, name)))
        return cls

    return decorate


def _answered_when_durable(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await method(self, *args, **kwargs)
        await self._syncs.durable()
        return result

    return call
