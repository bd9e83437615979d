"""What ``daskqueue.get_pool()`` inside a consumer's tasks is made from: one
:class:`PoolSource` per consumer (:class:`TaskPools`), made on the first batch.

Its own module so that the consumer actor (``daskqueue.consumer.base``) only holds it: the
source is made under a lock (several run threads start batches at once, and two sources would
mean two sets of handles, in a child process two Clients) and closed with the consumer. The
handles themselves are :mod:`daskqueue.queue.attached`'s.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any

from daskqueue.errors import ConfigurationError
from daskqueue.producers import ProducerSpec

if TYPE_CHECKING:  # the handles' module is imported on the first get_pool(), not with the consumer
    from daskqueue.queue.attached import PoolHandle

__all__ = ["TaskPools", "PoolSource"]

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
                    self._source = PoolSource(self.spec, calls if loop is not None else None, loop)
        return self._source

    def close(self) -> None:
        """Close what the source opened (a child's Client); the handles are forgotten."""
        source, self._source = self._source, None
        if source is not None:
            source.close()


class PoolSource:
    """What ``get_pool()`` returns in a consumer's tasks: a task handle per producer tag,
    made on first use and kept. On a worker (``calls`` and ``loop`` given) the handles call
    the consumer's own queues; in a child process (no worker) the source opens a Client to
    the scheduler on first use and attaches by name. Thread-safe."""

    def __init__(self, spec: ProducerSpec, calls: Any = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.spec = spec
        self._calls = calls
        self._loop = loop
        self._handles: dict[int, tuple[PoolHandle, frozenset[int] | None]] = {}  # with the queues it saw
        self._client: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<PoolSource {self.spec.name!r}: {'worker' if self._calls is not None else 'child'}>"

    def __call__(self, producer: int) -> PoolHandle:
        """The task handle of ``producer``; on a worker, made again when the consumer's set of
        queues changed since (a queue removed, lost or added: it routes to the queues now)."""
        with self._lock:
            queues = frozenset(self._calls.queues) if self._calls is not None else None
            made = self._handles.get(producer)
            if made is None or made[0].closed or made[1] != queues:
                made = self._handles[producer] = (self._make(producer), queues)
            return made[0]

    def _make(self, producer: int) -> PoolHandle:
        from daskqueue.queue.attached import attach_by_name, build_handle
        from daskqueue.queue.loop_queue import LoopQueue

        spec = self.spec.with_producer(producer)
        if self._calls is not None:
            n = max(len(spec.refs), 1 + max(self._calls.queues, default=-1))  # queues added since count
            handles = [LoopQueue(self._calls, q, self._loop) for q in range(n)]  # type: ignore[arg-type]
            missing = {q for q in range(n) if q not in self._calls.queues}
            return build_handle(spec, handles, None, role="task", removed=missing)
        return attach_by_name(self._child_client(), spec.name, producer=producer)

    def close(self) -> None:
        """Forget the handles; close the Client this source opened (a child process's)."""
        with self._lock:
            self._handles.clear()
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close(timeout=2)
            except Exception as e:  # the process is ending: its connection goes with it
                logger.debug("%r: closing its client failed: %s", self, e)

    def _child_client(self) -> Any:
        """This process's own client to the scheduler (a consumer's child has none)."""
        if self._client is None:
            if not self.spec.scheduler_address:
                raise ConfigurationError("get_pool() in a child process needs the scheduler's address; "
                                         "this consumer was made without it")
            from distributed import Client

            logger.info("child process: connecting to %s for get_pool()", self.spec.scheduler_address)
            self._client = Client(self.spec.scheduler_address, set_as_default=True)
        return self._client
