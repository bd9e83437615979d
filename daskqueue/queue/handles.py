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

The handle classes live in :mod:`daskqueue.queue.actor_handles` (they import Dask) and are
exported here on first use: the consumer modules import this one, and so does a consumer's
child process, which must start without importing Dask.
"""

from __future__ import annotations

import logging
from typing import Any

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


def __getattr__(name: str) -> Any:
    """The handle classes, imported on first use (see :mod:`daskqueue.queue.actor_handles`)."""
    if name in ("DirectActor", "WorkerActor"):
        from daskqueue.queue import actor_handles

        return getattr(actor_handles, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: How long the probe call of a direct connection may take before the pool gives up on it.
PROBE_TIMEOUT_S: float = 10.0

#: How often a wait for a queue actor's answer checks whether the actor's worker died.
LOST_CHECK_S: float = 1.0

#: How often a running queue or consumer actor checks that its worker still holds it.
ORPHAN_CHECK_S: float = 2.0


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
    from distributed.actor import Actor  # loaded on a worker; never asked in a child process

    if isinstance(queue, Actor):
        return queue.key, None
    return None, getattr(queue, "pool", None) or None


def free_actor(future: Any, handle: Any) -> None:
    """Let the scheduler forget an actor now: release the future that created it and the
    one its client-side handle holds (a handle caught in a reference cycle would otherwise
    hold the key until the next garbage collection, and its worker could not retire)."""
    future.release()
    close_lane = getattr(type(handle), "close_lane", None)  # its socket to the actor's lane
    if close_lane is not None:
        close_lane(handle)
    own = getattr(handle, "_future", None)
    if own is not None:
        own.release()


def queue_ref(handle: Any) -> tuple[type, str, str]:
    """What a consumer needs to call a queue actor: ``(class, address, key)``, plain data."""
    return (handle._cls, handle._address, handle.key)


def worker_handle(ref: Any) -> Any:
    """A :class:`WorkerActor` for a :func:`queue_ref` tuple; anything else as it is."""
    if not isinstance(ref, tuple):
        return ref
    from daskqueue.queue.actor_handles import WorkerActor

    return WorkerActor(*ref)


def direct_handles(
    handles: list[Any], *, client: Any = None, direct: bool | None = None, probe_timeout_s: float = PROBE_TIMEOUT_S
) -> list[Any]:
    """``handles`` as :class:`DirectActor` handles, if the client reaches their workers.

    ``direct=None`` probes one call per handle (``stats``) and keeps the plain handles, via
    the scheduler, if any probe fails; ``True`` uses direct handles without probing;
    ``False`` returns ``handles`` themselves. ``client`` is the pool's client, which the
    handles call through, plain ones included (default: the client Dask holds current).
    """
    from daskqueue.queue.actor_handles import DirectActor, bound_to

    if direct is False:
        return [bound_to(h, client) for h in handles]
    wrapped = [DirectActor(h._cls, h._address, h.key, client=client) for h in handles]
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
        return [bound_to(h, client) for h in handles]
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
