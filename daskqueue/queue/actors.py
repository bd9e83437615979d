"""Starting a pool's queue actors: their classes, arguments and placement."""

from __future__ import annotations

import time
from typing import Any

from distributed import Client

from daskqueue import defaults
from daskqueue.queue.config import PoolConfig
from daskqueue.queue.directory import prepare_pool_dir, queue_dir
from daskqueue.queue.durable import DurableQueue
from daskqueue.queue.transient import TransientQueue

__all__ = ["start_actors", "actor_args", "queue_kwargs"]


def queue_kwargs(config: PoolConfig, pool_name: str) -> dict[str, Any]:
    """Every queue actor's keyword arguments: the settings, and the pool's name (its load
    reports to the scheduler are counted per pool and queue)."""
    return dict(config.queue_kwargs(), pool=pool_name)


def actor_args(config: PoolConfig, *, prepare: bool = True) -> tuple[type, list[tuple[Any, ...]]]:
    """The queue actor class and each queue's positional arguments; prepares a durable
    pool's directory (unless ``prepare`` is false)."""
    n = config.n_queues
    if config.durability == "durable":
        if not prepare:
            return DurableQueue, [(i, queue_dir(config.dirpath, i)) for i in range(n)]  # type: ignore[arg-type]
        dirs = prepare_pool_dir(config.dirpath, n, config.dir_mode)  # type: ignore[arg-type]
        return DurableQueue, list(enumerate(dirs))
    return TransientQueue, [(i,) for i in range(n)]


def start_actors(client: Client, cls: type, args: list[tuple[Any, ...]], kwargs: dict[str, Any],
                 workers: list[str], *, spread: bool) -> tuple[list[Any], list[Any]]:
    """Start one actor of ``cls`` per ``args`` on ``workers[i]`` (only there if ``spread``);
    their handles and futures. If any fails (or does not start within
    ``QUEUE_START_TIMEOUT_S``), the others are released and the first error raised."""
    futures = [client.submit(cls, *a, **kwargs, actor=True, pure=False, workers=[w], allow_other_workers=not spread)
               for a, w in zip(args, workers)]
    deadline = time.monotonic() + defaults.QUEUE_START_TIMEOUT_S
    try:
        return [f.result(timeout=max(0.0, deadline - time.monotonic())) for f in futures], futures
    except BaseException:
        for f in futures:
            f.release()
        raise
