"""Every error daskqueue raises on purpose.

One root, :class:`DaskQueueError`, then groups by who caused the error:

* the caller passed something wrong (:class:`ConfigurationError`, :class:`InvalidTaskError`,
  :class:`SerializationError`, :class:`PayloadTooLargeError`);
* the queue's state refuses the call (:class:`QueueClosedError`, :class:`QueueEmpty`,
  :class:`LeaseExpiredError`);
* the queue's worker is gone (:class:`QueueLostError`), or the whole cluster with its
  scheduler (:class:`SchedulerLostError`); no consumer runs the work (:class:`NoConsumersError`);
* waiting ran out (:class:`JoinTimeoutError`; a queue that does not answer a call in time: :class:`QueueCallTimeoutError`);
* the durable store's files or disk refuse (:class:`StoreError` and its leaves);
* user code failed on a worker (:class:`RemoteTaskError`), or killed the process running it
  (:class:`KilledWorkerError`, as the ``exc_type`` of a ``RemoteTaskError``).

Leaves that wrap another exception set ``__cause__`` (``raise ... from e``). Every one is
imported from here; the root (and how errors pickle) is :mod:`daskqueue.error_root`'s, the
durable store's group is defined in :mod:`daskqueue.store_errors`.
"""

from __future__ import annotations

from daskqueue.error_root import DaskQueueError
from daskqueue.store_errors import (
    CorruptPoolFileError,
    CorruptRecordError,
    CorruptStoreError,
    ForeignDirectoryError,
    FormatVersionError,
    StoreError,
    StoreFullError,
    StoreIOError,
    StoreLockedError,
    StorePermissionError,
)

__all__ = [
    # the root
    "DaskQueueError",
    # the caller's mistakes
    "ConfigurationError", "NotATaskConsumerError", "InvalidTaskError", "SerializationError", "PayloadTooLargeError",
    "FieldTooLongError",
    # the queue's state
    "QueueClosedError", "ActorReleasedError", "PoolClosedError", "QueueLostError", "QueueMovedError", "QueueHandedOffError",
    "SchedulerLostError", "NoConsumersError", "NoWorkerError", "KilledWorkerError", "QueueEmpty",
    "TimeLimitExceeded", "LeaseExpiredError", "UnknownFunctionsError", "PackedGroupRefusedError",
    # waiting
    "JoinTimeoutError", "QueueCallTimeoutError",
    # user code
    "RemoteTaskError",
    # the durable store
    "StoreError", "StoreLockedError", "ForeignDirectoryError", "CorruptStoreError",
    "CorruptPoolFileError", "FormatVersionError", "CorruptRecordError", "StoreFullError",
    "StoreIOError", "StorePermissionError",
]


# -- the caller's mistakes ------------------------------------------------------------------------


class ConfigurationError(DaskQueueError, ValueError):
    """An argument to a constructor or method is out of range or of the wrong kind."""


class NotATaskConsumerError(ConfigurationError, RuntimeError):
    """``submit`` / ``batch_submit`` with daskqueue 0.2.0's ``worker_class=`` naming a consumer
    that does not run tasks (not a ``GeneralConsumer``): 0.2.0 raised ``RuntimeError`` here."""


class InvalidTaskError(DaskQueueError, TypeError):
    """A submitted task is not a task: its function is not callable, or its arguments are malformed."""


class SerializationError(DaskQueueError):
    """A function, argument or item could not be pickled (or unpickled).

    ``index`` is the position of the offending task in the caller's input (the submitted batch,
    or the whole iterable of a stream such as ``imap``; ``None`` for a single submission); the
    original error is the ``__cause__``.
    """

    def __init__(self, message: str, *, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class PayloadTooLargeError(DaskQueueError, ValueError):
    """One message's payload is larger than the queue accepts (``max_message_bytes``)."""

    _fields = ("size", "limit")
    _keyword_fields = ("index",)

    def __init__(self, size: int, limit: int, *, index: int | None = None) -> None:
        where = "" if index is None else f" (task {index} of the batch)"
        super().__init__(f"message of {size:,} bytes exceeds max_message_bytes={limit:,}{where}")
        self.size = size
        self.limit = limit
        self.index = index


class FieldTooLongError(ConfigurationError):
    """A message's ``type`` or ``key`` is longer than a queue can store (durable queues keep
    each in a 16-bit length, ``segment/FORMAT.md``): refused before anything was sent."""

    _fields = ("field", "length", "limit")

    def __init__(self, field: str, length: int, limit: int) -> None:
        super().__init__(f"{field} is {length:,} bytes in UTF-8; at most {limit:,} are allowed")
        self.field = field
        self.length = length
        self.limit = limit


# -- the queue's state ----------------------------------------------------------------------------


class QueueClosedError(DaskQueueError):
    """The queue or pool was closed; it accepts no more calls."""


class ActorReleasedError(QueueClosedError):
    """A call reached the worker of a queue actor after the worker released that actor (its
    pool closed it, removed its queue, or moved the queue on and freed the old actor).
    Nothing of the call ran. The pool reads it as a hand-off when it knows the queue moved
    away from that actor, and asks again where the queue is now; a user sees it only for a
    queue that was closed or removed."""


class PoolClosedError(QueueClosedError):
    """The pool an attached handle (or a handle inside a task) works on was closed by its
    owner, or is no longer registered under the name asked for: its queues accept nothing
    more. Or, with ``handle`` (what the handle is, e.g. ``"attached handle (producer 7)"``),
    that handle itself was closed and is still called through: the pool stays open, and a
    new handle attached by name uses it. ``name`` is the pool's name."""

    _fields = ("name", "detail")
    _keyword_fields = ("handle",)

    def __init__(self, name: str, detail: str = "", *, handle: str | None = None) -> None:
        self.name = name
        self.detail = detail
        self.handle = handle
        if handle is None:
            what = f"queue pool {name!r} was closed by its owner"
        else:
            what = (f"{handle} on queue pool {name!r} was closed (the pool stays open): it sends and reads "
                    f"nothing more; attach a new handle with QueuePool.attach(client, {name!r})")
        super().__init__(f"{what}{': ' + detail if detail else ''}")


class QueueLostError(DaskQueueError):
    """A queue actor's worker died or cannot be reached.

    A transient queue's messages (and its results not yet fetched) died with the worker. A
    durable queue's are on disk: a new ``QueuePool(..., durability="durable", dirpath=same)``
    recovers them. The error from Dask is the ``__cause__``.
    """

    _fields = ("queue_index", "address", "durability", "lost_messages")

    def __init__(self, queue_index: int, address: str, durability: str, lost_messages: int | None = None) -> None:
        if durability == "durable":
            what = "its messages are on disk: open a new QueuePool on the same dirpath to recover them"
        elif lost_messages is not None:
            what = (f"{lost_messages:,} of its transient messages (waiting, running, or done "
                    "with results not yet fetched) are lost with it")
        else:
            what = "its transient messages and unfetched results are lost with it"
        super().__init__(f"queue {queue_index} was lost with its worker {address}; {what}")
        self.queue_index = queue_index
        self.address = address
        self.durability = durability
        #: Transient queues: messages put there whose outcome the client never received.
        self.lost_messages = lost_messages


class QueueMovedError(QueueLostError):
    """A durable queue's worker died while a call to it was in flight; the pool reopened the
    queue on another worker. The call's outcome is unknown (a put may or may not be stored);
    calls made from now on go to the new actor."""

    _fields = ("queue_index", "address")
    durability = "durable"
    lost_messages = None

    def __init__(self, queue_index: int, address: str) -> None:
        DaskQueueError.__init__(
            self, f"queue {queue_index} was lost with its worker {address} while a call to it was "
            "in flight and reopened elsewhere from its directory; that call's outcome is unknown"
        )
        self.queue_index = queue_index
        self.address = address


class SchedulerLostError(DaskQueueError):
    """The client lost its scheduler: the workers, and every queue and consumer actor on them,
    go with it (Dask workers close when their scheduler is gone).

    Transient queues' messages are lost; durable queues' are on disk, and a new
    ``QueuePool(..., durability="durable", dirpath=same)`` on a new cluster recovers them.
    """

    _fields = ("status", "dirpath")

    def __init__(self, status: str, dirpath: str | None = None) -> None:
        what = (f"durable queues are safe on disk: open a new QueuePool on dirpath={dirpath!r} "
                "in a new cluster to recover them" if dirpath is not None
                else "transient queues' messages and unfetched results went with its workers")
        super().__init__(f"the client lost its scheduler (client status {status!r}); {what}")
        self.status = status
        self.dirpath = dirpath


class QueueHandedOffError(QueueMovedError):
    """A call reached a queue actor that no longer serves its queue: the queue moved on to
    another actor (handed off as its worker retired, or reopened from its directory after its
    worker was lost) or rests in its pool's client, waiting for a worker to join. Nothing of
    the call was done; the pool and the consumers repeat it where the queue is now, so users
    see it only if the move itself failed. ``reason`` says how the queue went, where the
    raiser knows (default: any of those ways)."""

    _keyword_fields = ("reason",)
    durability = "unknown"

    #: True of every way a queue leaves an actor that still gets calls.
    DEFAULT_REASON = ("the queue moved to another actor (handed off as its worker retired, or reopened "
                      "from its directory after its worker was lost) or rests in its pool's client")

    def __init__(self, queue_index: int, address: str, *, reason: str | None = None) -> None:
        DaskQueueError.__init__(
            self, f"queue {queue_index}'s actor on {address} no longer serves it: "
            f"{reason or self.DEFAULT_REASON}; nothing of this call was done: call the queue where it is now"
        )
        self.queue_index = queue_index
        self.address = address
        self.reason = reason


class NoWorkerError(DaskQueueError, TimeoutError):
    """A call needed a queue of a pool at rest (no worker yet, or adapt let the last one
    go) and no worker joined within ``waited_s``: the pool asked the cluster's ``adapt``
    for one, and none came (the cluster is not adaptive, its maximum is 0, or the batch
    system has not started the job yet). Nothing of the call was done."""

    _fields = ("queue_index", "waited_s")

    def __init__(self, queue_index: int, waited_s: float) -> None:
        super().__init__(
            f"queue {queue_index} waits for a worker to start on, and none joined within {waited_s:g} s: "
            "let the cluster grow (cluster.adapt(minimum=0, maximum=N)) or start workers "
            "(cluster.scale(N)); on a batch system, check that its jobs start (squeue)"
        )
        self.queue_index = queue_index
        self.waited_s = waited_s


class NoConsumersError(DaskQueueError):
    """``map`` or ``join`` would wait for work that no started consumer will ever run: no
    ``ConsumerPool`` on this queue pool is started."""


class KilledWorkerError(DaskQueueError):
    """The process running a message died (``os._exit``, a segfault, the OOM killer, a
    signal), like Dask's ``KilledWorker``. It counts as a failed attempt: the message is
    retried, and dead-lettered after ``max_retries``; ``ConsumerPool.failures()`` then holds a
    :class:`RemoteTaskError` whose ``exc_type`` is ``daskqueue.errors.KilledWorkerError``."""


class QueueEmpty(DaskQueueError):
    """A non-blocking get found no message ready."""


class TimeLimitExceeded(DaskQueueError):
    """Raised inside a task that ran past its time limit (``time_limit_s``): the task fails
    with it (retried, then dead-lettered). See ``daskqueue.consumer.limits`` for what it
    cannot interrupt."""


class LeaseExpiredError(DaskQueueError):
    """An ack or nack named a lease the queue no longer holds.

    The lease expired (or was settled already) and its messages were made ready again for
    another consumer, so this settlement is refused: the other delivery's outcome wins.
    """

    _fields = ("lease_id",)

    def __init__(self, lease_id: int) -> None:
        super().__init__(f"lease {lease_id} is unknown or expired; its messages were redelivered")
        self.lease_id = lease_id


class UnknownFunctionsError(DaskQueueError):
    """A put named functions (by ``digests``) that the queue no longer holds and the put did
    not carry: a queue evicts the functions no message of it uses. Raised before anything is
    stored; the client sends the same put again (same token) with those functions attached."""

    _fields = ("digests",)

    def __init__(self, digests: list[bytes]) -> None:
        super().__init__(f"the queue does not hold {len(digests)} function(s) the put names; send them")
        self.digests = list(digests)


class PackedGroupRefusedError(DaskQueueError):
    """A put carried a packed group (one pickle of many messages' payloads) to a queue whose
    storage keeps one record per message (a durable queue, ``segment/FORMAT.md``): refused,
    nothing stored. Clients send durable pools the per-message form; this names a client
    that did not."""

    _fields = ("queue", "kind")

    def __init__(self, queue: int, kind: str) -> None:
        super().__init__(f"queue {queue} ({kind}) stores one record per message and refuses a packed put group")
        self.queue = queue
        self.kind = kind


# -- waiting --------------------------------------------------------------------------------------


class JoinTimeoutError(DaskQueueError, TimeoutError):
    """``join`` gave up before every submitted message was settled; carries the counts."""

    _fields = ("timeout_s", "counts")

    def __init__(self, timeout_s: float, counts: dict[str, int]) -> None:
        shown = ", ".join(f"{k}={v:,}" for k, v in counts.items())
        super().__init__(f"work not settled after {timeout_s:g} s: {shown}")
        self.timeout_s = timeout_s
        self.counts = dict(counts)


class QueueCallTimeoutError(DaskQueueError, TimeoutError):
    """A queue did not answer a call within its deadline while its worker still counted as
    alive (its event loop blocked, the worker overloaded or stalled); the call's outcome is
    unknown. ``join``, ``map`` and ``result`` report their own timeouts as
    :class:`JoinTimeoutError`; this is every other call's (``stats``, a consumer's fetch...)."""

    _fields = ("queue_index", "method", "timeout_s", "address")

    def __init__(self, queue_index: int, method: str, timeout_s: float, address: str | None = None) -> None:
        where = f" at {address}" if address else ""
        super().__init__(f"queue {queue_index}{where} did not answer {method}() within {timeout_s:g} s")
        self.queue_index = queue_index
        self.method = method
        self.timeout_s = timeout_s
        self.address = address


# -- user code ------------------------------------------------------------------------------------


class RemoteTaskError(DaskQueueError):
    """A task (or ``process_item``) raised on a worker, on its last allowed attempt.

    Attributes: ``task_id``, ``exc_type`` (qualified name of the remote exception class),
    ``exc_message``, ``remote_traceback`` (the formatted traceback text from the worker) and
    ``attempts`` (how many times the message was delivered and failed).
    """

    def __init__(self, task_id: int, exc_type: str, exc_message: str, remote_traceback: str, attempts: int) -> None:
        super().__init__(task_id, exc_type, exc_message, remote_traceback, attempts)
        self.task_id = task_id
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.remote_traceback = remote_traceback
        self.attempts = attempts

    def __str__(self) -> str:
        return (
            f"task {self.task_id} failed after {self.attempts} attempt(s): "
            f"{self.exc_type}: {self.exc_message}\n\nRemote traceback:\n{self.remote_traceback}"
        )

    def __repr__(self) -> str:
        return f"RemoteTaskError(task_id={self.task_id}, {self.exc_type}: {self.exc_message!r})"
