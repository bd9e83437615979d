"""The queue actor handle classes (subclasses of Dask's ``Actor``): see
:mod:`daskqueue.queue.handles`, which exports them and holds the functions around them.

Kept apart because they import Dask at import time: ``handles`` is imported by the consumer
modules, which a consumer's child process imports too, and that process needs no Dask.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable, Generator

from distributed.actor import Actor
from distributed.protocol import to_serialize

from daskqueue.errors import ActorReleasedError
from daskqueue.queue.lane import LANE_HOLD_PUT_BYTES, LANE_MAX_PUT_BYTES, LaneClient, LaneFuture, lane_allowed
from daskqueue.queue.lane_wire import CLIENT_METHODS
from daskqueue.queue.worker_lane import WORKER_METHODS, lane_call

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
    a :class:`CallFuture`, or for a put or an outcome poll a
    :class:`~daskqueue.queue.lane.LaneFuture` once the actor's lane is known (see
    :mod:`daskqueue.queue.lane`: the call is written and read by the calling thread, and
    made through Dask again if the lane fails); otherwise (an asynchronous client, on a
    worker, in the loop) it behaves exactly like ``Actor`` (workers always call each other
    directly). It pickles as a plain ``Actor``, never with its lane.

    ``client`` is the client whose calls these are (a pool passes its own). Without it the
    handle binds Dask's current client, which is not the pool's when a process holds two
    (a synchronous and an asynchronous one, say): the handle then took the other's lane.
    """

    def __init__(self, cls: type, address: str, key: str, worker: Any = None, client: Any = None, *,
                 hold: bool = True) -> None:
        self._bind_to = client  # read by _try_bind_worker_client, which Actor's __init__ calls
        self._hold = hold
        super().__init__(cls, address, key, worker)
        self._lane: LaneClient | None = None
        self._lane_checked = False

    def _try_bind_worker_client(self) -> None:
        client = self.__dict__.get("_bind_to")
        if not self.__dict__.get("_hold", True) and self._client is None and self._worker is None:
            # A handle on somebody else's actor (a pool attached by name): it holds no Future
            # on the key, so it never keeps an actor its owner freed (a queue that moved off
            # a retiring worker: Dask refuses to retire a worker that still holds an actor).
            from distributed import get_client, get_worker

            try:
                self._worker = get_worker()
                return
            except ValueError:
                pass
            if client is None:
                try:
                    client = get_client()
                except ValueError:
                    return
            self._client = client
            return
        if client is None or self._client is not None or self._worker is not None:
            super()._try_bind_worker_client()
            return
        bound_to(self, client)

    @property
    def _worker_rpc(self) -> Any:
        if self._worker is None and self._client is not None:
            return self._client.rpc(self._address)
        return super()._worker_rpc

    def __getattr__(self, key: str) -> Any:
        if key in CLIENT_METHODS:
            conn = self._lane_now()
            if conn is not None:
                return self._on_lane(key, conn)
        if key.startswith("_") or not callable(getattr(self._cls, key, None)):
            return super().__getattr__(key)
        closed = self.__dict__.get("_released")
        if closed is not None:  # (its lane is closed, and its future released: none comes here)
            raise closed()
        if not self._from_client_thread():
            return super().__getattr__(key)
        if self._future is not None and self._future.status not in ("finished", "pending"):
            raise RuntimeError(f"Worker holding Actor was lost.  Status: {self._future.status}")
        if key in CLIENT_METHODS and not self._lane_checked:
            # The first such call makes the lane (then the short path above asks it: asked
            # here again, it would advance its discovery twice per call until it is known).
            lane = self._lane_client()
            conn = lane.connection() if lane is not None else None
            if conn is not None:
                return self._on_lane(key, conn)

        def call(*args: Any, **kwargs: Any) -> CallFuture:
            return self._call_through_dask(key, args, kwargs)

        return call

    def _call_through_dask(self, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallFuture:
        loop = self._client.loop.asyncio_loop
        return CallFuture(asyncio.run_coroutine_threadsafe(self._execute(key, args, kwargs), loop))

    def _lane_now(self) -> Any:
        """The lane connection to use for a call from this thread now, or None: the short
        path of ``__getattr__`` (a lane exists only once a call was found to be from a
        synchronous client's thread; an event loop's thread never uses it)."""
        lane = self.__dict__.get("_lane")
        if lane is None or asyncio._get_running_loop() is not None:
            return None
        if self._future is not None and self._future.status not in ("finished", "pending"):
            return None  # lost: the long path says so
        return lane.connection()

    def _on_lane(self, key: str, conn: Any) -> Any:
        """Method ``key`` called on the lane (through Dask where the lane cannot carry it)."""
        def call_on_lane(*args: Any, **kwargs: Any) -> Any:
            if kwargs or (key == "put_batch" and len(args[0]) > LANE_MAX_PUT_BYTES):
                return self._call_through_dask(key, args, kwargs)
            try:
                # A put goes out with its poll; a poll may be held at the actor its wait_s.
                wait_s = args[2] if key == "fetch_outcomes" and len(args) > 2 else 0.0
                wait_s = float(wait_s) if isinstance(wait_s, (int, float)) else 0.0
                hold = key == "put_batch" and len(args[0]) <= LANE_HOLD_PUT_BYTES
                rid = conn.send(key, args, hold=hold, wait_s=wait_s)
            except OSError:  # not sent (LaneBroken): through Dask
                rid = None
            if rid is None:
                return self._call_through_dask(key, args, {})
            return LaneFuture(conn, rid, lambda: self._call_through_dask(key, args, {}))

        return call_on_lane

    def _lane_client(self) -> LaneClient | None:
        """This handle's lane (None where none may be used: see ``lane_allowed``)."""
        if not self._lane_checked:
            self._lane_checked = True
            if getattr(self._cls, "lane_endpoint", None) is not None and lane_allowed(self._client, self._address):
                self._lane = LaneClient(lambda: self._call_through_dask("lane_endpoint", (self.key,), {}))
        return self._lane

    def lane_peer(self) -> tuple[str, int] | None:
        """``(host, port)`` of the actor's lane this handle's puts and polls use now, or None
        (they go through Dask)."""
        lane = self.__dict__.get("_lane")
        return None if lane is None else lane.peer()

    def close_lane(self) -> None:
        """Close this handle's lane socket, if any: its pool frees the actor (``free_actor``:
        the queue moved on, or was removed or closed). Later calls through it are answered
        :class:`ActorReleasedError` here, as the worker would once it has dropped the actor;
        sent, each made the worker log a ``KeyError`` traceback (see :meth:`_execute`)."""
        self._freed = True
        lane = self.__dict__.get("_lane")
        if lane is not None:
            lane.close()

    def release(self, closed: Callable[[], BaseException]) -> None:
        """Let go of this handle now, not at garbage collection: close its lane and release
        its client's hold on the actor's key. A method called on it afterwards (a thread
        still calling through it) raises ``closed()``, a typed error naming what was closed,
        not Dask's "Worker holding Actor was lost" of a released future (a lost worker)."""
        self._released = closed
        self.close_lane()
        own = self.__dict__.get("_future")
        if own is not None:
            own.release()

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
        """Run ``key`` on the actor (as ``Actor``'s calls do: the same errors).

        Not sent once the pool freed the actor (:meth:`close_lane`), even if called before
        (a lane call falls back to this when its lane closes): Dask's ``actor_execute``
        looks the actor up outside its ``try``, so each call that reaches the worker after
        it dropped the actor logs "Exception while handling op actor_execute" with a
        ``KeyError`` traceback there (``distributed.core``). A call already sent when the
        actor is freed still does: only Dask could answer it quietly."""
        if self.__dict__.get("_freed"):
            raise self._released_error()
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
            # The worker no longer holds the actor: it was released (its pool closed it, its
            # owner removed that queue, or the queue moved on and the old actor was freed
            # while this call was on its way). Dask's own proxy leaves such a call unanswered;
            # here it is a typed answer at once, which the tables read as "closed" or "moved".
            raise self._released_error() from None
        if answer["status"] == "OK":
            return answer["result"]
        raise answer["exception"]

    def _released_error(self) -> ActorReleasedError:
        return ActorReleasedError(f"{self.key} is no longer on its worker {self._address}: released")


def bound_to(handle: Actor, client: Any) -> Actor:
    """``handle`` (from ``future.result()`` of an actor's future) calling through ``client``.

    Dask binds a handle it deserializes to its *current* client, which is not the caller's
    when a process holds two (a synchronous one and an asynchronous one): the handle's calls
    then went through the other client, and its reference to the actor's key kept the actor
    alive after the caller released it. A handle on a worker, or anything but an ``Actor``
    (a stand-in), is left as it is."""
    if not isinstance(handle, Actor) or handle._worker is not None or handle._client is client or client is None:
        return handle
    from distributed import Future

    handle._client = client
    handle._future = Future(handle.key, client)
    return handle


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

    def __getattr__(self, key: str) -> Any:
        if key in WORKER_METHODS and self._by_lane():
            def call(*args: Any, **kwargs: Any) -> Any:
                if kwargs:  # the wire carries positional arguments only
                    return super(WorkerActor, self).__getattr__(key)(*args, **kwargs)
                return lane_call(self, key, args, self._through_dask)

            return call
        return super().__getattr__(key)

    def _by_lane(self) -> bool:
        """Whether a call made now may take the actor's lane: on a worker's event loop, to
        an actor on another worker (see :mod:`daskqueue.queue.worker_lane`)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._try_bind_worker_client()
        worker = self.__dict__.get("_worker")
        return worker is not None and worker.address != self._address

    async def _through_dask(self, method: str, args: tuple[Any, ...]) -> Any:
        return await super().__getattr__(method)(*args)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (WorkerActor, (self._cls, self._address, self.key))
