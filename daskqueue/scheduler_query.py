"""What the scheduler knows of its workers, asked of the scheduler itself.

``Client.scheduler_info()`` answers from the client's cache, which its periodic refresh fills
with ``n_workers=0`` (no workers): read just after that refresh, it says "0 workers". A
worker count that decides something (how many queues a pool gets) is asked here instead,
with a deadline (``Client.scheduler_info`` takes none).
"""

from __future__ import annotations

from typing import Any

from daskqueue import defaults

__all__ = ["scheduler_workers", "worker_threads"]


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
