"""daskqueue: a distributed task queue that runs inside a Dask cluster, on Dask actors."""

from __future__ import annotations

import logging

from daskqueue.consumer.base import ConsumerBase, ConsumerStats
from daskqueue.consumer.general import GeneralConsumer
from daskqueue.consumer.pool import ConsumerPool
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
from daskqueue.queue.base import QueueStats
from daskqueue.queue.durable import DurableQueue
from daskqueue.queue.pool import QueuePool
from daskqueue.producers import get_pool
from daskqueue.queue.transient import TransientQueue
from daskqueue.results import DeadLetter

from daskqueue._version import __version__

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
    """daskqueue 0.2.0's names, kept for old scripts (each warns once)."""
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
