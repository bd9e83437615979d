"""The queue actor's gate: work that grows with the whole queue (a durable queue's
compaction) runs on a thread of its own while the queue is *paused*.

A mixin of :class:`~daskqueue.queue.base.QueueActorBase` (see there why mixins). Every method
of the actor waits at the gate (``_unpaused``) before it reads or changes any state, so the
paused work's thread is the only one touching the queue while it runs.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

__all__ = ["GateMixin"]

T = TypeVar("T")


class GateMixin:
    """``_unpaused`` (the gate) and ``_run_paused`` (work behind it)."""

    index: int

    def _init_gate(self) -> None:
        self._paused: asyncio.Event | None = None  # set when the paused work has finished

    async def _unpaused(self) -> None:
        """The gate: return once no paused work runs. Every method calls it before it reads or
        changes state, and again after any ``await`` that may have let a pause begin.

        The data plane checks ``self._paused is not None`` before calling it, so the gate
        costs one attribute check when nothing is paused (always, in a transient queue).
        """
        while self._paused is not None:
            await self._paused.wait()

    async def _run_paused(self, work: Callable[[], T]) -> T:
        """Run ``work()`` on a thread of its own while every other call waits at the gate.

        ``work`` may touch every piece of the queue's state; nothing on the loop does until it
        has returned. The pause ends when the thread does, even if the caller is cancelled
        meanwhile (the future is shielded; its done-callback ends the pause). The thread is
        started here and ends with ``work``: nobody has to stop it. One runs at a time.
        """
        await self._unpaused()
        done = self._paused = asyncio.Event()
        executor = ThreadPoolExecutor(1, thread_name_prefix=f"daskqueue-{self.index}-paused")
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, work)
        except BaseException:
            self._resume(done)
            raise
        finally:
            executor.shutdown(wait=False)  # the thread exits once ``work`` returns
        future.add_done_callback(lambda _: self._resume(done))
        return await asyncio.shield(future)

    def _resume(self, done: asyncio.Event) -> None:
        self._paused = None
        done.set()
