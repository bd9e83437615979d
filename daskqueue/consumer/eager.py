"""Starting a coroutine at once, on the caller's step of the event loop, and leaving the
rest of it to a task: what ``asyncio.Task(coro, eager_start=True)`` does on Python 3.12+,
for 3.10 and 3.11 too.

Why: a task made with ``create_task`` starts on a later round of the loop, behind whatever
is ready by then. When a consumer's fetch loop gets a batch, the callbacks ready by then
include the reply to the put that made the batch (a socket write, 0.3-0.6 ms after an idle
gap): started on a later round, the batch reaches its run thread only after it. Started
eagerly, the batch is handed to its run thread (or its child process) before the fetch
loop goes on, and the rest (awaiting the run, settling) waits in a task as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["start_eagerly"]

T = TypeVar("T")


def start_eagerly(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run ``coro`` now, up to its first suspension; return a task (a future) for the rest.

    A coroutine that ends without suspending gives a future already done (its result or its
    exception). The task created for the rest is cancelled like any task: the cancellation
    is thrown into ``coro`` where it waits. Runs on the event loop's thread only, in the
    caller's context (not a copy of it, as a task's would be).
    """
    loop = asyncio.get_running_loop()
    try:
        first = coro.send(None)
    except StopIteration as stop:
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(stop.value)
        return done
    except BaseException as e:  # noqa: BLE001  (handed to whoever awaits the future, as a task would)
        failed: asyncio.Future[T] = loop.create_future()
        failed.set_exception(e)
        return failed
    return loop.create_task(_resume(coro, first))


async def _resume(coro: Coroutine[Any, Any, T], first: Any) -> T:
    return await _Resumed(coro, first)


class _Resumed:
    """Awaitable that carries on a coroutine which already yielded ``first`` to the loop:
    the task awaiting it sees that same yield (the future ``coro`` waits on), and every
    value or exception the task sends later goes on to ``coro``, as ``yield from`` would."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self._coro, self._first
        self._first = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:  # noqa: BLE001  (cancellation, thrown in by the task)
                try:
                    value = coro.throw(e)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
