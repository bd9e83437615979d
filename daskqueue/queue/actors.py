"""Starting a pool's queue actors: their classes, arguments and placement; whether a cluster
with no worker may get one, and the handles of queues that have no actor yet."""

from __future__ import annotations

import time
from typing import Any

from distributed import Client

from daskqueue import defaults
from daskqueue.queue.actor_handles import bound_to
from daskqueue.queue.config import PoolConfig
from daskqueue.queue.directory import prepare_pool_dir, queue_dir
from daskqueue.queue.durable import DurableQueue
from daskqueue.queue.transient import TransientQueue

__all__ = ["start_actors", "actor_args", "queue_kwargs", "Unplaced", "can_grow", "NO_WORKERS_HINT"]

#: What a pool made on a cluster with no worker, and no way to get one, says to do.
NO_WORKERS_HINT = ("the client's cluster has no workers and none will join: start some first "
                   "(cluster.scale(n), client.wait_for_workers(n)), or let it grow on demand "
                   "(cluster.adapt(minimum=0, maximum=n)), then make the pool")


class Unplaced:
    """The handle of a queue that has had no actor yet (its pool was made before any worker
    joined): its table marks it resting, so no call reaches this; it names the queue's
    class, and an address that is no worker's."""

    _address = ""

    def __init__(self, cls: type, index: int) -> None:
        self._cls = cls
        self.key = f"unplaced-{cls.__name__}-{index}"

    def __repr__(self) -> str:
        return f"<Unplaced {self._cls.__name__} queue>"


def can_grow(client: Client) -> bool:
    """Whether ``client``'s cluster, with no worker now, may get one: a cluster this client
    only knows by its scheduler's address (its deployment may add workers), one that adapts
    (with a maximum above 0), or one with workers asked for that have not joined yet."""
    cluster = getattr(client, "cluster", None)
    if cluster is None:
        return True
    adaptive = getattr(cluster, "_adaptive", None)  # Dask's Cluster.adapt() keeps it there
    if adaptive is not None and getattr(adaptive, "state", "running") in ("starting", "running") \
            and (getattr(adaptive, "maximum", 1) or 0) > 0:
        return True
    try:
        return bool(cluster.plan)
    except Exception:  # a cluster class without a plan: it may grow
        return True


def queue_kwargs(config: PoolConfig, pool_name: str, *, lane: bool = True) -> dict[str, Any]:
    """Every queue actor's keyword arguments: the settings, and the pool's name (its load
    reports to the scheduler are counted per pool and queue). ``lane=False`` (the pool was
    made with the ``daskqueue.lane`` config false): the actors serve no lane, not even to
    other workers (see :mod:`daskqueue.queue.lane_server`)."""
    kwargs = dict(config.queue_kwargs(), pool=pool_name)
    if not lane:
        kwargs["lane"] = False
    return kwargs


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
        handles = [bound_to(f.result(timeout=max(0.0, deadline - time.monotonic())), client) for f in futures]
        return handles, futures
    except BaseException:
        for f in futures:
            f.release()
        raise
