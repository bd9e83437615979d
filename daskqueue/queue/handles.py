"""Client-side queue handles that talk to their worker directly, not through the scheduler.

A Dask ``Actor`` handle held by a client sends every method call through the scheduler
(``ProxyRPC``) unless the client was made with ``direct_to_workers=True``: two extra network
hops per call, and every put blob of a million-task ``map`` passing through the scheduler's
process. daskqueue's design keeps the scheduler out of the data path, so the ``QueuePool``
wraps its queue handles in :class:`DirectActor`, which opens a connection to the actor's
worker instead. ``python -m benchmarks.direct`` measures both in one run: on a 2-core machine,
single-task submit -> result p50 after an idle gap went from 6.7 to 5.5 ms; ``map``
throughput did not change beyond the noise (the scheduler was not the bottleneck there).

Where the client cannot reach the workers (a login node behind a firewall), the first call
is probed at pool creation and the pool falls back to the scheduler's proxy, with a warning.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.actor import Actor

__all__ = [
    "DirectActor",
    "WorkerActor",
    "direct_handles",
    "queue_ref",
    "worker_handle",
    "is_lost_worker",
    "actor_lost",
    "call_all",
    "free_actor",
    "released_actor",
    "LOST_CHECK_S",
    "ORPHAN_CHECK_S",
    "bind_local",
    "queue_identity",
]

logger = logging.getLogger("daskqueue")

#: How long the probe call of a direct connection may take before the pool gives up on it.
PROBE_TIMEOUT_S: float = 10.0

#: How often a wait for a queue actor's answer checks whether the actor's worker died.
LOST_CHECK_S: float = 1.0

#: How often a running queue or consumer actor checks that its worker still holds it.
ORPHAN_CHECK_S: float = 2.0


class DirectActor(Actor):
    """An ``Actor`` handle whose calls from a client go straight to the actor's worker.

    On a worker it behaves exactly like ``Actor`` (workers always call each other
    directly), and it pickles as a plain ``Actor``.
    """

    @property
    def _worker_rpc(self) -> Any:
        if self._worker is None and self._client is not None:
            return self._client.rpc(self._address)
        return super()._worker_rpc


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


def bind_local(handle: Any) -> Any:
    """The actor object behind ``handle`` if it lives in this worker process (its ``async``
    methods are then awaited directly, without a call through the comm), else ``handle``
    itself (also off a worker: tests driving an actor by hand)."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return handle
    key, address = getattr(handle, "key", None), getattr(handle, "_address", None)
    if key is None or address != worker.address:
        return handle
    return worker.state.actors.get(key, handle)


def queue_identity(queue: Any) -> tuple[str | None, str | None]:
    """``(Dask key, pool name)`` of a queue a consumer holds, as far as it knows: an actor
    handle knows its key, a queue object bound in this process (:func:`bind_local`) its pool."""
    if isinstance(queue, Actor):
        return queue.key, None
    return None, getattr(queue, "pool", None) or None


def free_actor(future: Any, handle: Any) -> None:
    """Let the scheduler forget an actor now: release the future that created it and the
    one its client-side handle holds (a handle caught in a reference cycle would otherwise
    hold the key until the next garbage collection, and its worker could not retire)."""
    future.release()
    own = getattr(handle, "_future", None)
    if own is not None:
        own.release()


def queue_ref(handle: Any) -> tuple[type, str, str]:
    """What a consumer needs to call a queue actor: ``(class, address, key)``, plain data."""
    return (handle._cls, handle._address, handle.key)


def worker_handle(ref: Any) -> Any:
    """A :class:`WorkerActor` for a :func:`queue_ref` tuple; anything else as it is."""
    return WorkerActor(*ref) if isinstance(ref, tuple) else ref


def direct_handles(
    handles: list[Any], *, direct: bool | None = None, probe_timeout_s: float = PROBE_TIMEOUT_S
) -> list[Any]:
    """``handles`` as :class:`DirectActor` handles, if the client reaches their workers.

    ``direct=None`` probes one call per handle (``stats``) and keeps the plain handles, via
    the scheduler, if any probe fails; ``True`` uses direct handles without probing;
    ``False`` returns ``handles`` unchanged.
    """
    if direct is False:
        return handles
    wrapped = [DirectActor(h._cls, h._address, h.key) for h in handles]
    if direct is True:
        return wrapped
    try:
        futures = [h.stats() for h in wrapped]
        for f in futures:
            f.result(timeout=probe_timeout_s)
    except (OSError, TimeoutError) as e:
        logger.warning(
            "the client cannot call the queue actors' workers directly (%s); calls go "
            "through the scheduler instead, which is slower", e,
        )
        return handles
    return wrapped


def is_lost_worker(error: BaseException) -> bool:
    """Whether ``error``, raised by an actor call, means the actor's worker is gone or
    unreachable. Dask says so with ``OSError("Unable to contact Actor's worker")`` (any comm
    failure of the call) or ``RuntimeError("Worker holding Actor was lost...")``; an
    ``OSError`` the actor method itself raised is passed on as it is."""
    text = str(error)
    if isinstance(error, OSError):
        return "Unable to contact Actor's worker" in text
    return isinstance(error, RuntimeError) and "Actor was lost" in text


def actor_lost(handle: Any) -> bool:
    """Whether Dask has marked the actor behind ``handle`` lost with its worker (its key's
    future went to ``error``). False for a local actor object, which has no future."""
    future = getattr(handle, "_future", None)
    return future is not None and future.status == "error"



def released_actor(obj: Any) -> bool:
    """Whether ``obj``, an actor object, was released by its worker: the client that owned
    its future is gone (a notebook kernel restarted, a script killed), so the scheduler
    forgot the key and the worker dropped the actor. Dask does not stop what the object
    runs itself (its sweeper, its fetch loop), nor close its files: it must do so on its
    own. False off a worker (an object driven by hand, in tests)."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return False
    return not any(a is obj for a in worker.state.actors.values())


def call_all(targets: list[tuple[Any, Any]], method: str, *args: Any, timeout_s: float) -> list[str]:
    """Call ``method(*args)`` on every ``(name, handle)`` concurrently and wait for all of them
    within one deadline of ``timeout_s``; never raises. Returns the failures, as text naming
    the target: a dead worker (whose handle may raise at once, or never answer) must not stop
    the call to the others."""
    import time

    deadline = time.monotonic() + timeout_s
    pending, failed = [], []
    for name, handle in targets:
        try:
            pending.append((name, getattr(handle, method)(*args)))
        except Exception as e:
            failed.append(f"{name}: {type(e).__name__}: {e}")
    for name, future in pending:
        try:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        except Exception as e:
            failed.append(f"{name}: {type(e).__name__}: {e}")
    return failed
