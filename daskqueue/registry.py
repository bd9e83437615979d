"""Where the daskqueue pools of a cluster can be found.

Every ``QueuePool`` registers itself on the scheduler (Dask's scheduler metadata,
``client.set_metadata``) under its ``name``: its durability and directory, and a reference to
each of its queue actors; every ``ConsumerPool`` registers its consumers under the queue
pool's name. The command line (``daskqueue stats``, ``daskqueue dead-letters``), the status
page and the metrics find the pools there, from any client of the cluster. An entry is
updated when a queue moves or the pool's queues change, always before the actor it named
is freed (attached handles follow it: see :mod:`daskqueue.queue.attached`), and removed when
the pool closes;
an entry left by a client that died stays until a pool of the same name replaces it, and its
actors then answer as lost (readers must expect that).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__all__ = ["POOLS_KEY", "CONSUMERS_KEY", "register_pool", "unregister_pool", "register_consumers",
           "unregister_consumers", "registered_pools", "registered_pool", "actor_from_ref", "actor_ref"]

logger = logging.getLogger("daskqueue")

#: The scheduler metadata keys: ``[POOLS_KEY, name]`` holds a pool's entry, and
#: ``[CONSUMERS_KEY, name, consumer pool id]`` its consumer pools' consumers.
POOLS_KEY = "daskqueue-pools"
CONSUMERS_KEY = "daskqueue-consumers"

#: Longest a registration may take (the scheduler may be gone: a pool must still close).
REGISTRY_TIMEOUT_S = 5.0


def actor_ref(handle: Any) -> tuple[str, str, str]:
    """``(class import path, worker address, key)`` of an actor handle: plain data."""
    cls = handle._cls
    return (f"{cls.__module__}:{cls.__qualname__}", handle._address, handle.key)


def actor_from_ref(ref: tuple[str, str, str], client: Any = None) -> Any:
    """An actor handle (its calls go straight to its worker, through ``client``, by default
    the current one) from :func:`actor_ref` data. It holds no reference on the actor's key:
    the actor is its owner's to free (see ``DirectActor``'s ``hold``)."""
    from daskqueue.queue.handles import DirectActor

    path, address, key = ref
    module, _, qualname = path.partition(":")
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    return DirectActor(cls, address, key, client=client, hold=False)


def _set(client: Any, keys: list[str], value: Any) -> None:
    try:
        client.sync(client.scheduler.set_metadata, keys=keys, value=value, callback_timeout=REGISTRY_TIMEOUT_S)
    except Exception as e:  # the registry is for finding pools: never fail the pool for it
        logger.warning("could not register %s on the scheduler: %s: %s", "/".join(keys), type(e).__name__, e)


def _delete(client: Any, keys: list[str]) -> None:
    """Mark an entry gone (None): the scheduler's metadata has no delete operation."""
    _set(client, keys, None)


def register_pool(pool: Any) -> None:
    """Register (or update) ``pool``'s entry: called when it starts and when its queues change."""
    serving = pool.serving()
    queues = {str(i): actor_ref(handle) for i, handle in serving.items()}
    table, router = getattr(pool, "table", None), getattr(pool, "router", None)
    # "removed": the queues taken out for good (not in "queues" either, as a queue being
    # moved is not): attached handles stop polling those, and wait for the others;
    # "resting": queues with no actor, their state kept in the owner's client until a worker
    # can take them (attached handles wait for those, as the owner's calls do);
    # "draining": serving queues new messages no longer go to (being removed).
    entry = {"name": pool.name, "durability": pool.durability, "dirpath": pool.dirpath,
             "n_queues": pool.n_queues, "queues": queues,
             "removed": sorted(table.removed) if table is not None else [],
             "resting": sorted(getattr(table, "resting", ())) if table is not None else [],
             "draining": sorted(set(serving) - set(router.targets)) if router is not None else []}
    config = getattr(pool, "config", None)
    if config is not None:  # what QueuePool.attach(client, name) rebuilds a handle from
        entry.update(config=config.as_dict(), time_limit_s=getattr(pool, "time_limit_s", None))
    _set(pool.client, [POOLS_KEY, pool.name], entry)


def unregister_pool(pool: Any) -> None:
    _delete(pool.client, [POOLS_KEY, pool.name])
    _delete(pool.client, [CONSUMERS_KEY, pool.name])


def register_consumers(consumer_pool: Any) -> None:
    """Register (or update) a consumer pool's consumers under its queue pool's name."""
    qp = consumer_pool.queue_pool
    refs = [actor_ref(h) for h in consumer_pool.consumers]
    _set(consumer_pool.client, [CONSUMERS_KEY, qp.name, consumer_pool.id], refs)


def unregister_consumers(consumer_pool: Any) -> None:
    _delete(consumer_pool.client, [CONSUMERS_KEY, consumer_pool.queue_pool.name, consumer_pool.id])


def registered_pool(client: Any, name: str) -> dict[str, Any] | None:
    """The entry of the pool registered as ``name`` (None if there is none, or it closed).
    Unlike :func:`registered_pools` it raises if the scheduler cannot be asked."""
    entry = client.sync(client.scheduler.get_metadata, keys=[POOLS_KEY, name], default=None,
                        callback_timeout=REGISTRY_TIMEOUT_S)
    return dict(entry) if entry else None


def registered_pools(client: Any) -> dict[str, dict[str, Any]]:
    """Every registered pool's entry by name, with ``"consumers"``: the refs of every
    consumer working on it (from all its consumer pools)."""
    def get(key: str) -> dict[str, Any]:
        try:
            return client.sync(client.scheduler.get_metadata, keys=[key], default={},
                               callback_timeout=REGISTRY_TIMEOUT_S) or {}
        except KeyError:
            return {}

    pools = get(POOLS_KEY)
    consumers = get(CONSUMERS_KEY)
    out = {}
    for name, entry in pools.items():
        if entry is None:  # closed
            continue
        entry = dict(entry)
        entry["consumers"] = [ref for refs in (consumers.get(name) or {}).values() if refs for ref in refs]
        out[name] = entry
    return out
