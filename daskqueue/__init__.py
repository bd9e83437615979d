"""daskqueue: a distributed task queue that runs inside a Dask cluster, on Dask actors.

The pools, consumers and queue actors import Dask (about 1 s): they are loaded when first
used (PEP 562 ``__getattr__``, table ``_LAZY``), so that ``import daskqueue`` stays light for
the consumer's child process, which needs none of them (``daskqueue.consumer.child``).
``from daskqueue import X`` and ``from daskqueue import *`` work as with plain imports.
A new export whose module imports Dask goes into ``_LAZY`` and the ``TYPE_CHECKING`` block;
a light one is imported as usual.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from daskqueue.errors import (
    ConfigurationError,
    DaskQueueError,
    InvalidTaskError,
    JoinTimeoutError,
    LeaseExpiredError,
    TimeLimitExceeded,
    PayloadTooLargeError,
    QueueClosedError,
    QueueLostError,
    SchedulerLostError,
    NoConsumersError,
    KilledWorkerError,
    QueueEmpty,
    RemoteTaskError,
    SerializationError,
    StoreError,
    StoreLockedError,
    ForeignDirectoryError,
    CorruptStoreError,
    FormatVersionError,
    CorruptRecordError,
    StoreFullError,
    StoreIOError,
    StorePermissionError,
    QueueCallTimeoutError,
    FieldTooLongError,
    CorruptPoolFileError,
    NoWorkerError,
    NotATaskConsumerError,
    UnknownFunctionsError,
)
from daskqueue.messages import Message, Task, make_id, split_id
from daskqueue.producers import get_pool
from daskqueue.results import DeadLetter

from daskqueue._version import __version__


#: Public names loaded on first use: name -> module (each of them imports Dask).
_LAZY = {
    "ConsumerBase": "daskqueue.consumer.base",
    "ConsumerStats": "daskqueue.consumer.base",
    "GeneralConsumer": "daskqueue.consumer.general",
    "ConsumerPool": "daskqueue.consumer.pool",
    "QueueStats": "daskqueue.queue.base",
    "DurableQueue": "daskqueue.queue.durable",
    "QueuePool": "daskqueue.queue.pool",
    "TransientQueue": "daskqueue.queue.transient",
}

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported
    from daskqueue.consumer.base import ConsumerBase, ConsumerStats
    from daskqueue.consumer.general import GeneralConsumer
    from daskqueue.consumer.pool import ConsumerPool
    from daskqueue.queue.base import QueueStats
    from daskqueue.queue.durable import DurableQueue
    from daskqueue.queue.pool import QueuePool
    from daskqueue.queue.transient import TransientQueue

__all__ = [
    "DeadLetter",
    # pools (what most users need)
    "QueuePool",
    "ConsumerPool",
    "get_pool",
    # consumers and messages
    "ConsumerBase",
    "GeneralConsumer",
    "Message",
    "Task",
    "make_id",
    "split_id",
    # queue actors and stats
    "TransientQueue",
    "DurableQueue",
    "QueueStats",
    "ConsumerStats",
    # errors
    "DaskQueueError",
    "ConfigurationError",
    "InvalidTaskError",
    "SerializationError",
    "PayloadTooLargeError",
    "QueueClosedError",
    "QueueLostError",
    "SchedulerLostError",
    "NoConsumersError",
    "KilledWorkerError",
    "QueueEmpty",
    "LeaseExpiredError",
    "TimeLimitExceeded",
    "JoinTimeoutError",
    "RemoteTaskError",
    "StoreError",
    "StoreLockedError",
    "ForeignDirectoryError",
    "CorruptStoreError",
    "FormatVersionError",
    "CorruptRecordError",
    "StoreFullError",
    "StoreIOError",
    "StorePermissionError",
    "QueueCallTimeoutError",
    "FieldTooLongError",
    "CorruptPoolFileError",
    "NoWorkerError",
    "NotATaskConsumerError",
    "UnknownFunctionsError",
]

logging.getLogger("daskqueue").addHandler(logging.NullHandler())

# daskqueue 0.2.0's modules named like a class here (daskqueue.QueuePool, .ConsumerPool):
# loaded now, without binding them over the classes (see daskqueue.compat.old_paths).
from daskqueue.compat import old_paths as _old_paths  # noqa: E402

_old_paths.register()

from daskqueue.joblib_hook import register_when_imported as _joblib_hook  # noqa: E402

_joblib_hook()  # joblib's backend="daskqueue", registered when joblib is imported (never imports it)


def __getattr__(name: str) -> object:
    """The ``_LAZY`` names, imported now; and daskqueue 0.2.0's names, kept for old scripts
    (each warns once)."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # found as a plain attribute from now on
        return value
    from daskqueue.compat import deprecated

    if name in ("ConsumerBaseClass", "DummyConsumer"):
        from daskqueue.compat import consumers

        deprecated(name, f"{name} is daskqueue 0.2.0's spelling; subclass ConsumerBase, whose "
                   "process_item(self, message) gets a Message (message.data is the item). A ConsumerBaseClass "
                   "subclass's process_item still gets the raw item, as in 0.2.0")
        return getattr(consumers, name)
    if name == "Durability":
        from daskqueue.compat.durability import Durability

        deprecated(name, "daskqueue.Durability is daskqueue 0.2.0's spelling; use QueuePool(durability=\"durable\", "
                   "dirpath=...) or durability=\"transient\"")
        return Durability
    raise AttributeError(f"module 'daskqueue' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
