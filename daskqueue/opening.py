"""Pools that start at once, or on ``await`` when made in an asynchronous client's loop."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

__all__ = ["OpensOnAwait"]


class OpensOnAwait:
    """``pool = Pool(sync_client, ...)`` starts the pool's actors at once;
    ``pool = await Pool(async_client, ...)`` starts them on a thread, since blocking in the
    event loop of an asynchronous client would stall the loop those calls need."""

    _opening: Callable[[], None] | None = None

    def _open_now_or_on_await(self, client: Any, open_: Callable[[], None]) -> None:
        if client.asynchronous:
            self._opening = open_
            return
        self._opening = None
        open_()

    def __await__(self) -> Any:
        async def opened() -> Any:
            if self._opening is not None:
                opening, self._opening = self._opening, None
                await asyncio.to_thread(opening)
            return self
        return opened().__await__()
