"""The control plane of a queue pool: which queues exist, in which order, and their sizes.

Asked rarely (when a client attaches, for sizes and stats); no message passes through it.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["QueuePoolActor"]


class QueuePoolActor:
    """Holds the pool's configuration and its queue actors' handles."""

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self.name = name
        self.config = dict(config)
        self._queues: list[Any] = []

    async def register(self, queues: list[Any]) -> None:
        """Record the pool's queues, in routing order."""
        self._queues = list(queues)

    async def get_queues(self) -> list[Any]:
        return list(self._queues)

    async def get_config(self) -> dict[str, Any]:
        return dict(self.config)

    async def stats(self) -> list[Any]:
        """``QueueStats`` of every queue, gathered concurrently."""
        return list(await asyncio.gather(*(q.stats() for q in self._queues)))
