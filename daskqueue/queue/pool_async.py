"""``QueuePool``'s inspection and lifetime methods for an event loop: each runs its blocking
twin on a thread. A mixin of :class:`~daskqueue.queue.pool.QueuePool` (the submission ones,
``map_async`` and the like, are in :mod:`~daskqueue.queue.submitting`)."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["QueuePoolAsync"]


class QueuePoolAsync:
    """The ``_async`` forms of ``stats`` and ``close``."""

    _opening: Any

    async def stats_async(self) -> list[Any]:
        """:meth:`stats`, awaited (on a thread)."""
        return await asyncio.to_thread(self.stats)  # type: ignore[attr-defined,no-any-return]

    async def close_async(self) -> None:
        """:meth:`close`, awaited (on a thread)."""
        if self._opening is None:
            await asyncio.to_thread(self.close)  # type: ignore[attr-defined]
