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
)
from daskqueue.messages import Message, Task, make_id, split_id
from daskqueue.queue.base import QueueStats
from daskqueue.queue.durable import DurableQueue
from daskqueue.queue.pool import QueuePool
from daskqueue.queue.transient import TransientQueue
from daskqueue.results import DeadLetter

__version__ = "0.1.0"

__all__ = [
    "DeadLetter",
    # pools (what most users need)
    "QueuePool",
    "ConsumerPool",
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
]

logging.getLogger("daskqueue").addHandler(logging.NullHandler())


def __getattr__(name: str) -> object:
    """daskqueue 0.2.0's names, kept for old scripts (each warns once)."""
    if name == "ConsumerBaseClass":
        from daskqueue.compat import deprecated

        deprecated("ConsumerBaseClass", "ConsumerBaseClass is daskqueue 0.2.0's spelling; use ConsumerBase "
                   "(process_item(self, message) gets a Message whose .data is the item, as before)")
        return ConsumerBase
    raise AttributeError(f"module 'daskqueue' has no attribute {name!r}")
