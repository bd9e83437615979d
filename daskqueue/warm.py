"""Workers import daskqueue's actor modules ahead of need.

``import daskqueue`` loads the pools, queues and consumers on first use (a consumer's child
process needs none of Dask). A worker therefore imports a queue actor's modules (segments,
crc32c, the lifecycle core: 0.2-0.45 s on a 2-core machine) when it is first asked to hold
one: for a durable queue that fails over, or a queue handed off from a retiring worker,
that is on the critical path, between the old worker's death and the successor serving.
The worker plugin here starts that import on every worker as it joins (and on those
already there when the first pool of a client is made), on a thread of its own so that the
worker's event loop is not held while it runs.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from daskqueue.scheduler_query import register_plugin

__all__ = ["ACTOR_MODULES", "WarmWorkers", "warm_workers"]

logger = logging.getLogger("daskqueue")

#: What a worker imports to hold a queue or run a consumer.
ACTOR_MODULES = ("daskqueue.queue.transient", "daskqueue.queue.durable", "daskqueue.consumer.general")


def _import_all(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # imported again, with its error, by whoever needs it
            logger.debug("daskqueue: warming %s failed: %s", name, e)


class WarmWorkers(WorkerPlugin):
    """Import :data:`ACTOR_MODULES` on each worker, in the background, once it starts."""

    name = "daskqueue-warm"
    idempotent = True

    def __init__(self, modules: tuple[str, ...] = ACTOR_MODULES) -> None:
        self.modules = tuple(modules)

    def setup(self, worker: Any) -> None:
        threading.Thread(target=_import_all, args=(self.modules,), name="daskqueue-warm", daemon=True).start()


def warm_workers(client: Any) -> None:
    """Register :class:`WarmWorkers` with ``client``'s cluster (once per scheduler: it is
    idempotent); a failure only logs (nothing depends on it but the speed of a move)."""
    try:
        register_plugin(client, WarmWorkers())
    except Exception as e:
        logger.info("daskqueue: workers not warmed (%s): actor modules load on first use", e)
