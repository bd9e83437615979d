"""``ConsumerPool``'s methods for an event loop: each runs its blocking twin on a thread, so
the loop goes on meanwhile. A mixin of :class:`~daskqueue.consumer.pool.ConsumerPool`."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterable

__all__ = ["ConsumerPoolAsync"]


class ConsumerPoolAsync:
    """The ``_async`` forms of ``start``, ``join``, ``as_completed`` and ``close``."""

    _opening: Any

    async def start_async(self) -> None:
        """:meth:`start`, awaited (on a thread)."""
        await asyncio.to_thread(self.start)  # type: ignore[attr-defined]

    async def join_async(self, timeout: float | None = None) -> None:
        """:meth:`join`, awaited: it waits on a thread, so the event loop goes on."""
        await asyncio.to_thread(lambda: self.join(timeout=timeout))  # type: ignore[attr-defined]

    async def as_completed_async(self, ids: Iterable[int] | None = None, *,
                                 timeout: float | None = None) -> AsyncIterator[tuple[int, Any]]:
        """:meth:`as_completed` for ``async for``: each poll's outcomes are fetched on a thread."""
        batches = self.outcome_batches(None if ids is None else list(ids), timeout)  # type: ignore[attr-defined]
        while True:
            batch = await asyncio.to_thread(next, batches, None)
            if batch is None:
                return
            for item in batch:
                yield item

    async def close_async(self) -> None:
        """:meth:`close`, awaited (on a thread)."""
        if self._opening is None:
            await asyncio.to_thread(self.close)  # type: ignore[attr-defined]
