"""What ``daskqueue.get_pool()`` inside a consumer's tasks is made from: one
:class:`~daskqueue.queue.attached.PoolSource` per consumer, made on the first batch.

Its own module so that the consumer actor (``daskqueue.consumer.base``) only holds it: the
source is made under a lock (several run threads start batches at once, and two sources would
mean two sets of handles, in a child process two Clients) and closed with the consumer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

__all__ = ["TaskPools"]

logger = logging.getLogger("daskqueue")


class TaskPools:
    """The consumer's source of pool handles for its tasks, made once, thread-safe.

    ``spec``: the queue pool's :class:`~daskqueue.producers.ProducerSpec` (None: the consumer
    was made without it, and ``get_pool()`` in its tasks raises)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self._source: Any = None
        self._lock = threading.Lock()

    def source(self, calls: Any, loop: asyncio.AbstractEventLoop | None) -> Any:
        """The source (made on first use): through ``calls`` on the worker's ``loop``, or, with
        no loop (a consumer's twin in a child process), through a Client of its own."""
        if self._source is None and self.spec is not None:
            with self._lock:
                if self._source is None:
                    from daskqueue.queue.attached import PoolSource

                    self._source = PoolSource(self.spec, calls if loop is not None else None, loop)
        return self._source

    def close(self) -> None:
        """Close what the source opened (a child's Client); the handles are forgotten."""
        source, self._source = self._source, None
        if source is not None:
            source.close()
