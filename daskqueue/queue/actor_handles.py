"""The queue actor handle classes (subclasses of Dask's ``Actor``): see
:mod:`daskqueue.queue.handles`, which exports them and holds the functions around them.

Kept apart because they import Dask at import time: ``handles`` is imported by the consumer
modules, which a consumer's child process imports too, and that process needs no Dask.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Generator

from distributed.actor import Actor
from distributed.protocol import to_serialize

from daskqueue.errors import QueueClosedError

__all__ = ["DirectActor", "WorkerActor"]


class CallFuture:
    """A call in flight from a synchronous client's thread: ``result(timeout)`` and
    ``done()`` as on Dask's ``ActorFuture`` (a timeout raises the builtin ``TimeoutError``),
    and awaitable. Unlike ``ActorFuture.result``, waiting does not go through the client's
    event loop (``sync`` adds a callback there, wakes that thread, and only then waits):
    the loop thread sets the answer, the caller's thread wakes once."""

    __slots__ = ("_future",)

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError as e:
            if isinstance(e, TimeoutError):  # one class since Python 3.11
                raise
            raise TimeoutError(str(e)) from e

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.wrap_future(self._future).__await__()


class DirectActor(Actor):
    """An ``Actor`` handle whose calls from a client go straight to the actor's worker.

    Called from a synchronous client's own thread (not its event loop), a method returns
    a :class:`CallFuture`; otherwise (an asynchronous client, on a worker, in the loop) it
    behaves exactly like ``Actor`` (workers always call each other directly). It pickles
    as a plain ``Actor``.
    """

    @property
    def _worker_rpc(self) -> Any:
        if self._worker is None and self._client is not None:
            return self._client.rpc(self._address)
        return super()._worker_rpc

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_") or not callable(getattr(self._cls, key, None)) or not self._from_client_thread():
            return super().__getattr__(key)
        if self._future is not None and self._future.status not in ("finished", "pending"):
            raise RuntimeError(f"Worker holding Actor was lost.  Status: {self._future.status}")
        loop = self._client.loop.asyncio_loop

        def call(*args: Any, **kwargs: Any) -> CallFuture:
            return CallFuture(asyncio.run_coroutine_threadsafe(self._execute(key, args, kwargs), loop))

        return call

    def _from_client_thread(self) -> bool:
        """Whether calls are made from a synchronous client's thread, not its loop."""
        self._try_bind_worker_client()
        if self._worker is not None or self._client is None or self._client.asynchronous:
            return False
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return True
        return False  # in an event loop: the caller awaits

    async def _execute(self, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``key`` on the actor (as ``Actor``'s calls do: the same errors)."""
        try:
            answer = await self._worker_rpc.actor_execute(
                function=key, actor=self.key, args=[to_serialize(a) for a in args],
                kwargs={k: to_serialize(v) for k, v in kwargs.items()},
            )
        except OSError:
            raise OSError("Unable to contact Actor's worker") from None
        except KeyError as e:
            if e.args != (self.key,):
                raise
            # The worker no longer holds the actor: it was released (its pool closed it, or
            # its owner removed that queue). Dask's own proxy leaves such a call unanswered;
            # here it is a typed answer at once, which the tables read as "closed".
            raise QueueClosedError(f"{self.key} is no longer on its worker {self._address}: released") from None
        if answer["status"] == "OK":
            return answer["result"]
        raise answer["exception"]


class WorkerActor(Actor):
    """An ``Actor`` handle for use on a worker that holds no reference on the actor's key.

    A plain ``Actor`` made on a worker binds a worker client and a ``Future`` on the key,
    and one passed to ``client.submit`` is a dependency of the new task (an ``Actor`` is a
    ``TaskRef``): either keeps the scheduler from forgetting a queue actor that moved, and
    Dask then refuses to retire its worker. Consumers get :func:`queue_ref` tuples and make
    these from them.
    """

    def _try_bind_worker_client(self) -> None:
        if not self._worker:
            try:
                from distributed import get_worker

                self._worker = get_worker()
            except ValueError:
                self._worker = None

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (WorkerActor, (self._cls, self._address, self.key))
