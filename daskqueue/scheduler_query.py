"""What the scheduler knows of its workers, asked of the scheduler itself.

``Client.scheduler_info()`` answers from the client's cache, which its periodic refresh fills
with ``n_workers=0`` (no workers): read just after that refresh, it says "0 workers". A
worker count that decides something (how many queues a pool gets) is asked here instead,
with a deadline (``Client.scheduler_info`` takes none).
"""

from __future__ import annotations

from typing import Any

from daskqueue import defaults

__all__ = ["scheduler_workers", "worker_threads", "register_plugin"]


def scheduler_workers(client: Any, *, timeout_s: float = defaults.CONTROL_CALL_TIMEOUT_S) -> dict[str, Any]:
    """``{address: worker info}`` of every worker the scheduler of ``client`` knows now;
    raises a ``TimeoutError`` after ``timeout_s``."""
    if getattr(client, "asynchronous", False):
        # ``sync`` would hand back a coroutine here (the caller is on the client's own loop
        # and cannot block on it): the client's cache, as before this module.
        return dict(client.scheduler_info(n_workers=-1)["workers"])
    info = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout_s)
    return dict(info["workers"])


def worker_threads(client: Any, *, timeout_s: float = defaults.CONTROL_CALL_TIMEOUT_S) -> int:
    """The threads of every worker of ``client``'s cluster, in all (0: no worker yet)."""
    return sum(w.get("nthreads", 1) for w in scheduler_workers(client, timeout_s=timeout_s).values())


def register_plugin(client: Any, plugin: Any, *, timeout_s: float = defaults.CONTROL_CALL_TIMEOUT_S) -> Any:
    """``client.register_plugin(plugin)`` (a scheduler or worker plugin, registered under its
    ``name``), with a deadline: ``Client.register_plugin`` takes none, and a scheduler that
    accepts the connection but does not answer held the caller (a pool being opened) for good.
    Raises a ``TimeoutError`` after ``timeout_s``."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    if getattr(client, "asynchronous", False):  # on the client's loop: as Dask does it
        return client.register_plugin(plugin)
    # Dask's own coroutines behind register_plugin, run with the deadline ``sync`` takes.
    register = client._register_scheduler_plugin if isinstance(plugin, SchedulerPlugin) \
        else client._register_worker_plugin
    return client.sync(register, plugin=plugin, name=plugin.name, idempotent=bool(getattr(plugin, "idempotent", False)),
                       callback_timeout=timeout_s)
