"""A consumer's queue as a task's pool handle sees it: calls from a run thread, made on the
worker's event loop (see :class:`LoopQueue`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

from daskqueue.errors import QueueLostError

__all__ = ["LoopQueue"]


class LoopQueue:
    """A consumer's queue ``slot``, called from one of its run threads: each call runs on the
    worker's event loop through the consumer's own :class:`~daskqueue.consumer.calls.QueueCalls`
    (a queue in this process is awaited directly, another through the worker's connection)
    and answers with a ``concurrent.futures.Future``, as a :class:`QueueTable` expects."""

    _future = None  # no Dask future of its own: never "marked lost" (see handles.actor_lost)

    def __init__(self, calls: Any, slot: int, loop: asyncio.AbstractEventLoop) -> None:
        self._calls = calls
        self._slot = slot
        self._loop = loop
        self._last = threading.local()  # .target: the queue handle this thread's last call went to

    def moved_since_last_call(self) -> bool:
        """Whether the consumer's handle of this queue changed since this thread's last call
        (the pool told it where the queue moved), or the queue is no longer the consumer's."""
        return self._calls.queues.get(self._slot) is not getattr(self._last, "target", None)

    def __repr__(self) -> str:
        return f"<LoopQueue {self._slot}>"

    @property
    def _address(self) -> str:
        return getattr(self._calls.queues.get(self._slot), "_address", None) or "this worker"

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any) -> Any:
            if self._slot not in self._calls.queues:  # taken out of the pool since
                failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
                failed.set_exception(QueueLostError(self._slot, self._address, "unknown"))
                return failed
            self._last.target = self._calls.queues[self._slot]
            return asyncio.run_coroutine_threadsafe(self._calls.call_moving(self._slot, method, *args), self._loop)

        return call
