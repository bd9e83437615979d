"""Producers anywhere: a pool handle inside a running task (``get_pool()``), a pool passed to a
task as an argument (a ``QueuePool`` pickles), and a second client attached by name.

Every handle on a pool is a *producer* with a tag: the pool's owner (the ``QueuePool`` that
created the queues) has tag 0, each attached handle (``QueuePool.attach(client, name)``) a
fresh random one. Every message carries the tag of the handle that put it, and the queues
keep each producer's outcomes apart: a handle reads exactly the outcomes of what it put (see
:mod:`daskqueue.queue.producer_results`). A handle inside a task (``get_pool()``, or a pool
unpickled on a worker) puts with the tag of the message it runs, or of the pool it was
pickled from: the follow-ups of a task are read by whoever submitted the task (the owner,
for work the owner submitted).

Where a task runs decides how its handle reaches the queues:

* on a consumer's run thread (``isolation="thread"``): through that consumer's own queue
  handles, on the worker's event loop (no scheduler hop, the same batching as a client);
* in a consumer's child process (the default isolation puts user code there, with no Dask
  worker): the child opens its own ``distributed.Client`` to the scheduler on the first
  ``get_pool()`` and attaches by name, then puts straight to the queue actors;
* anywhere else a pool is unpickled: on a worker, through the worker's connections; in a
  client process, through the current client.

This module holds the context of the running task (a thread-local: which pool, which
producer) and the plain data a handle is rebuilt from (:class:`ProducerSpec`). It does no
I/O itself; building handles is :mod:`daskqueue.queue.attached`'s.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from daskqueue.errors import ConfigurationError

__all__ = ["ProducerSpec", "TaskPool", "get_pool", "new_producer_tag", "new_map_tag", "MAP_TAG", "running_in",
           "set_producer", "current_source", "ClassOrInstanceMethod", "OWNER"]

logger = logging.getLogger("daskqueue")


class TaskPool(Protocol):
    """What :func:`get_pool` returns, as far as a task uses it: a
    :class:`~daskqueue.QueuePool` (a handle on the pool the running message came from).

    Named by what it does, not imported: this module is imported by the pool's modules, and
    the pool's import here (even one for type checkers only) made an import cycle."""

    name: str

    def submit(self, *args: Any, **kwargs: Any) -> Any: ...
    def batch_submit(self, *args: Any, **kwargs: Any) -> Any: ...
    def put_many(self, *args: Any, **kwargs: Any) -> Any: ...
    def map(self, *args: Any, **kwargs: Any) -> Any: ...
    def imap(self, *args: Any, **kwargs: Any) -> Any: ...
    def imap_unordered(self, *args: Any, **kwargs: Any) -> Any: ...

#: The producer tag of a pool's owner.
OWNER = 0

#: Attached producers' tags are drawn from 1 .. 2**31 - 1 (a CHUNK header holds a u32; the
#: top bit marks the tag of a ``map`` inside a task, :func:`new_map_tag`).
_TAG_LIMIT = 1 << 31

#: The bit of a tag that reads the outcomes of a ``map`` called inside a task.
MAP_TAG = 1 << 31


def new_producer_tag() -> int:
    """A fresh producer tag for an attached handle (random: no coordination needed; two
    handles attached at once share one with odds of about 1 in 2 billion)."""
    return 1 + secrets.randbelow(_TAG_LIMIT - 1)


def new_map_tag() -> int:
    """A fresh tag for the handle of a ``map`` inside a task: only that map reads its
    outcomes, and the handle closes when the map returns, so tasks run by it cannot enqueue
    follow-ups through ``get_pool()`` (no one would read theirs; see :func:`get_pool`)."""
    return MAP_TAG | new_producer_tag()


@dataclass(frozen=True)
class ProducerSpec:
    """What a pool handle is rebuilt from elsewhere (plain data, picklable).

    ``refs``: an :func:`~daskqueue.registry.actor_ref` per queue index (None for a queue not
    serving when the spec was made); ``producer``: the tag puts carry;
    ``scheduler_address``: where a process with no client connects (a consumer's child).
    """

    name: str
    config: Any  # a PoolConfig
    time_limit_s: float | None
    refs: tuple[Any, ...]
    producer: int = OWNER
    scheduler_address: str | None = None

    def __repr__(self) -> str:
        return f"ProducerSpec({self.name!r}, producer={self.producer}, {len(self.refs)} queues)"

    def with_producer(self, producer: int) -> ProducerSpec:
        """The same pool, for producer ``producer``."""
        return ProducerSpec(self.name, self.config, self.time_limit_s, self.refs, producer, self.scheduler_address)


class ClassOrInstanceMethod:
    """A method with one behaviour called on the class and another on an instance
    (``QueuePool.attach(client, name)`` vs. the older ``queue_pool.attach(consumer_pool)``)."""

    def __init__(self, on_class: Callable[..., Any], on_instance: Callable[..., Any]) -> None:
        self._on_class = on_class
        self._on_instance = on_instance
        functools.update_wrapper(self, on_class)

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return functools.update_wrapper(functools.partial(self._on_class, objtype), self._on_class)
        return functools.update_wrapper(functools.partial(self._on_instance, obj), self._on_instance)


# -- the running task's context ----------------------------------------------------------------

_context = threading.local()


def running_in(source: Callable[[int], TaskPool] | None) -> None:
    """Called by a consumer on its run thread before a batch (and with None after):
    ``source(producer_tag)`` gives the pool handle ``get_pool()`` returns."""
    _context.source = source
    _context.producer = OWNER


def current_source() -> Any:
    """The running task's source of pool handles (None outside a running message)."""
    return getattr(_context, "source", None)


def set_producer(producer: int) -> None:
    """Called by a consumer on its run thread before each span of a batch: the producer tag
    of the messages it runs now (follow-ups carry it)."""
    _context.producer = producer


def get_pool() -> TaskPool:
    """The pool the running message came from, as a handle for enqueueing follow-up work.

    Call it inside a task function or ``ConsumerBase.process_item``. ``submit``,
    ``batch_submit``, ``put_many`` and ``map`` on it go straight to the queue actors; the
    outcomes of what it submits are read by the producer that submitted the running message
    (the pool's owner for work the owner submitted), with ``result(id)`` on the ids the task
    returns, ``results()``, ``as_completed()``; a consumer pool's ``join()`` waits for them
    too. A follow-up put that cannot be stored raises in the task (so the task fails, and
    is retried), never silently.

    Raises :class:`ConfigurationError` outside a running message, and in a task started by
    ``map`` called inside another task: that map's handle reads the outcomes of what it
    maps and closes when the map returns, so the outcomes of follow-ups such a task enqueued
    would be read by no one (the ids it returned up the chain would never resolve). Pass the
    pool to the mapped function as an argument instead (its follow-ups are then read by the
    producer that pickled it), or use ``submit``/``batch_submit`` in the outer task.
    """
    source = getattr(_context, "source", None)
    if source is None:
        raise ConfigurationError("daskqueue.get_pool() is for code running inside a daskqueue task or "
                                 "process_item; elsewhere use the QueuePool itself, or "
                                 "QueuePool.attach(client, name)")
    producer = getattr(_context, "producer", OWNER)
    if producer & MAP_TAG:
        raise ConfigurationError("daskqueue.get_pool() in a task started by map() inside another task: no one "
                                 "would read its follow-ups' outcomes (the map's handle closes when the map "
                                 "returns); pass the pool to the mapped function as an argument instead")
    return source(producer)
