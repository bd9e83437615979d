"""``QueuePool``: the client-side handle of a pool of queue actors.

A thin facade over the parts that each own one job: the :class:`~daskqueue.queue.table.QueueTable`
(handles, calls and their deadlines), the pure :class:`~daskqueue.queue.router.Router` (where new
messages go), the :class:`~daskqueue.queue.sending.Sender` (puts and their ids), the
:class:`~daskqueue.queue.follow.Follower` (following the cluster: hand-off, reopen, park),
:mod:`~daskqueue.queue.resize` (``add_queues`` / ``remove_queue``),
:mod:`~daskqueue.queue.deadletters`, and :class:`~daskqueue.outcomes.Outcomes` (waiting for
results, shared with the consumer pool). The public API for submitting is in
:mod:`~daskqueue.queue.submitting`, for taking outcomes in :mod:`~daskqueue.queue.taking`.

The pool follows the cluster (see :mod:`daskqueue.membership`): when a worker dies, every
surviving queue takes back at once the leases of the consumers that died with it, and a queue
that died with it is known lost, so every call that needs it raises :class:`QueueLostError` at
once instead of waiting on a dead address.

Other producers (a second client attached by name, a handle inside a task, a pickled pool)
are :mod:`~daskqueue.queue.pool_producers`' and :mod:`~daskqueue.queue.attached`'s.

The interface of a consumer pool to its queue pool (and back) is explicit
(:mod:`~daskqueue.queue.pool_consumers`): the queue pool offers :meth:`QueuePool.register_consumer_pool`, :meth:`~QueuePool.queue_refs`, :attr:`~QueuePool.homes`,
:meth:`~QueuePool.lost_addresses`, :meth:`~QueuePool.set_slots`,
:meth:`~QueuePool.check_scheduler`, :attr:`~QueuePool.outcomes`, :attr:`~QueuePool.closed`;
a consumer pool answers ``on_queues_changed()``, ``on_queue_moved(q, handle)`` and
``on_workers_retiring(workers)``.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
import weakref
from typing import Any

from distributed import Client

from daskqueue import atexit_close, defaults, registry
from daskqueue.compat.queue_pool import QueuePool020
from daskqueue.membership import forget, membership
from daskqueue.errors import ConfigurationError, QueueClosedError, StoreLockedError
from daskqueue.executing import Executing
from daskqueue.outcomes import Outcomes
from daskqueue.scheduler_query import worker_threads
from daskqueue.queue.base import QueueStats
from daskqueue.queue.config import Durability, FsyncPolicy, PoolConfig, default_n_queues
from daskqueue.queue.actors import NO_WORKERS_HINT, Unplaced, actor_args, can_grow, queue_kwargs, start_actors
from daskqueue.queue.directory import removed_queues
from daskqueue.queue.follow import Follower
from daskqueue.queue.handles import direct_handles
from daskqueue.queue.lane import lane_enabled
from daskqueue.queue.options import MAX_TIME_LIMIT_S, Eta, eta_epoch_s
from daskqueue.queue.policy import Scheduler
from daskqueue.queue.pool_async import QueuePoolAsync
from daskqueue.queue.pool_consumers import ServesConsumerPools
from daskqueue.queue.pool_settings import PoolSettings
from daskqueue.queue.resize import add_queues, remove_queue, take_out
from daskqueue.queue.router import Router
from daskqueue.queue.sending import Sender
from daskqueue.queue.streaming import Streaming
from daskqueue.queue.submitting import Submitting, not_in_client_loop
from daskqueue.queue.taking import Taking
from daskqueue.queue.table import QueueTable
from daskqueue.results import ResultCollector
from daskqueue.opening import OpensOnAwait
from daskqueue.queue.pool_producers import Producing
from daskqueue.validate import check_number, check_optional_str

__all__ = ["QueuePool", "Eta", "eta_epoch_s", "MAX_TIME_LIMIT_S"]

logger = logging.getLogger("daskqueue")

#: The name other modules and tests import (kept).
_not_in_client_loop = not_in_client_loop

#: The open durable pools of this process, by directory (see ``QueuePool._take_over``).
_open_dirs: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


class QueuePool(QueuePool020, PoolSettings, Producing, Submitting, Streaming, Taking, QueuePoolAsync,
                OpensOnAwait, Executing, ServesConsumerPools):
    """A pool of ``n_queues`` queue actors on the cluster of ``client``.

    Messages are routed round-robin, one put batch at a time; a call's messages are spread
    evenly over the queues, at most ``put_batch_size`` per put.
    Every submission returns message ids; results and failures come back through
    :meth:`results` / :meth:`failures` / :meth:`result` (or as the return value of :meth:`map`).

    Parameters (all but ``client`` and ``n_queues`` keyword-only):

    * ``n_queues``: ``None`` (default) picks it from the cluster's worker threads when the pool
      is made (``daskqueue.queue.config.default_n_queues``: 1 up to 25 threads, then one more
      per 25, at most 32; a durable pool 1); see benchmarks/README.md, "Issue 24: peers".
    * ``durability``: ``"transient"`` (in worker memory, lost with the worker) or
      ``"durable"`` (on disk under ``dirpath``, one directory per queue; a new pool on the
      same ``dirpath``, in this or a new cluster, recovers every queue). The workers must see
      ``dirpath`` (a shared file system, or the same host).
    * ``fsync`` (durable): ``"always"``, ``"interval"`` (every ``fsync_interval_s``, default
      0.1 s) or ``"never"``; see ``daskqueue/segment/FORMAT.md`` for what each loses.
    * ``max_segment_bytes`` (durable, default 64 MiB, at least 4 KiB): log segment size; also
      caps one message.
    * ``compact_index_bytes`` (durable, default 16 MiB): index size that triggers compaction.
    * ``time_limit_s`` (default None: no limit): how long a message may run before it is
      interrupted (a failed attempt); every enqueue call can set its own.
    * ``dir_mode`` (durable, default ``0o700``): the mode of the directories the pool creates
      (their files get the same bits without execute: ``0o600``). Anyone who can write them
      can run code in the workers and the client (payloads and results are pickles).
    * ``lease_timeout_s`` (default 30): how long a delivered message may stay unsettled
      before it is redelivered; consumers extend the leases of work they are running.
    * ``max_retries`` (default 3): failed runs retried before a message is dead-lettered.
    * ``retry_backoff_base_s`` / ``retry_backoff_max_s``: exponential backoff between retries.
    * ``max_message_bytes`` (default 64 MiB): largest pickled task or item.
    * ``put_batch_size`` (default 20,000): messages per ``put_batch`` call.
    * ``scheduler``: ``"fifo"`` (default), ``"fair"`` or ``"capped"``: how queues choose
      between message types (see the README's "Scheduling"); ``max_type_share`` (0.8),
      ``max_scan`` (1,000), and for ``"capped"`` ``max_type_cap`` and ``type_caps``
      (``{type: cap}``). In a fair or capped pool every message of one type goes to one
      queue, so that caps hold pool-wide.
    * ``direct_to_workers``: ``None`` (default) calls the queue actors' workers directly
      when the client can reach them (checked once, here) and through the scheduler
      otherwise; ``True`` / ``False`` force one or the other. Defaults to the client's own
      ``direct_to_workers`` setting when that is set.

    The settings are validated into :attr:`config` (a :class:`PoolConfig`); a bad one raises
    :class:`ConfigurationError` naming it.

    Thread safety: use one ``QueuePool`` from one thread at a time. (daskqueue 0.2.0's
    spellings: see :mod:`daskqueue.compat.queue_pool`.)
    """

    #: The ``daskqueue.lane`` config as the pool was made: its queue actors (successors and
    #: added ones too) serve a lane, to its clients and to other workers, only if true.
    _serve_lanes: bool = True

    def __init__(
        self,
        client: Client,
        n_queues: int | None = None,
        *,
        durability: Durability = "transient",
        lease_timeout_s: float = defaults.LEASE_TIMEOUT_S,
        max_retries: int = defaults.MAX_RETRIES,
        retry_backoff_base_s: float = defaults.RETRY_BACKOFF_BASE_S,
        retry_backoff_max_s: float = defaults.RETRY_BACKOFF_MAX_S,
        max_message_bytes: int = defaults.MAX_MESSAGE_BYTES,
        put_batch_size: int = defaults.PUT_BATCH_MESSAGES,
        dirpath: str | os.PathLike[str] | None = None,
        fsync: FsyncPolicy = "interval",
        fsync_interval_s: float = defaults.FSYNC_INTERVAL_S,
        max_segment_bytes: int = defaults.MAX_SEGMENT_BYTES,
        compact_index_bytes: int = defaults.COMPACT_INDEX_BYTES,
        scheduler: Scheduler = "fifo",
        max_type_share: float = defaults.MAX_TYPE_SHARE,
        max_scan: int = defaults.MAX_SCAN,
        max_type_cap: int | None = None,
        type_caps: dict[str, int] | None = None,
        name: str | None = None,
        direct_to_workers: bool | None = None,
        dir_mode: int = defaults.DIR_MODE,
        time_limit_s: float | None = None,
    ) -> None:
        if not isinstance(client, Client):
            raise ConfigurationError(f"client must be a distributed.Client, got {type(client).__name__}")
        durability = self._accept_020_durability(durability)
        if n_queues is None:  # the scale model's default (config.default_n_queues); a durable
            # pool's count is on its disk, so a reopen with the default finds it as it was
            n_queues = 1 if durability == "durable" else default_n_queues(worker_threads(client))
        self.config = PoolConfig.from_options(
            n_queues, durability=durability, lease_timeout_s=lease_timeout_s, max_retries=max_retries,
            retry_backoff_base_s=retry_backoff_base_s, retry_backoff_max_s=retry_backoff_max_s,
            max_message_bytes=max_message_bytes, put_batch_size=put_batch_size, dirpath=dirpath,
            fsync=fsync, fsync_interval_s=fsync_interval_s, max_segment_bytes=max_segment_bytes,
            compact_index_bytes=compact_index_bytes, scheduler=scheduler, max_type_share=max_type_share,
            max_scan=max_scan, max_type_cap=max_type_cap, type_caps=dict(type_caps or {}), dir_mode=dir_mode,
        )
        check_number("time_limit_s", time_limit_s, above=0, at_most=MAX_TIME_LIMIT_S, none_ok=True)
        #: How long a message may run unless its submission says otherwise (None: no limit).
        self.time_limit_s = time_limit_s
        self.client = client
        self.name = check_optional_str("name", name) or f"queuepool-{uuid.uuid4().hex[:8]}"
        self._serve_lanes = lane_enabled()
        self.table: QueueTable | None = None
        self._closed = False
        self._open_now_or_on_await(client, lambda: self._open(direct_to_workers))

    def _open(self, direct_to_workers: bool | None) -> None:
        client = self.client
        self.membership = membership(client, owner=self)
        view = self.membership.view
        try:
            self._take_over(self.dirpath)
            self._start(direct_to_workers, view)
        except BaseException:
            forget(self)
            raise
        if self.dirpath is not None:
            _open_dirs[self.dirpath] = self
        # A worker that joined or left while the queues started is told now, as a change.
        self.membership.add_listener(self, since=view)
        registry.register_pool(self)
        atexit_close.track(self)
        from daskqueue import status

        status.install(client)  # the status page beside Dask's dashboard (never raises)
        logger.info("%r started", self)

    def _take_over(self, dirpath: str | None) -> None:
        """Another pool of this process still has ``dirpath`` open (a notebook cell run
        again, or daskqueue 0.2.0's way of reopening a durable pool): close it, so that this
        one can lock the directory; refuse (at once) while consumers run on it."""
        other = None if dirpath is None else _open_dirs.get(dirpath)
        if other is None or other.closed:
            return
        if other.has_running_consumers():
            raise StoreLockedError(f"{dirpath} is open in {other!r}, with consumers running: close them and it "
                                   "first (consumer_pool.close(); queue_pool.close()), or use that pool")
        logger.warning("%r has %s open: closing it, so that a new pool can open it", other, dirpath)
        other.close()

    def _start(self, direct_to_workers: bool | None, view: Any) -> None:
        """Start the queue actors (queue ``i`` on worker ``i mod n_workers`` of ``view``, a
        :class:`~daskqueue.membership.View`, only there when there are at least as many
        workers as queues) and the parts that work on them."""
        workers = sorted(view.workers - view.retiring)
        if not workers and not can_grow(self.client):
            raise ConfigurationError(NO_WORKERS_HINT)
        n = self.config.n_queues
        queue_class, queue_args = self.actor_args()
        if direct_to_workers is None:
            direct_to_workers = self.client.direct_to_workers
        if workers:
            handles, futures = start_actors(self.client, queue_class, queue_args, self.queue_kwargs(),
                                            [workers[i % len(workers)] for i in range(n)], spread=len(workers) >= n)
            handles = direct_handles(handles, client=self.client, direct=direct_to_workers)
        else:  # the queues start on the first worker that joins (see Follower.rest_new)
            handles, futures = [Unplaced(queue_class, i) for i in range(n)], [None] * n
        self.collector = ResultCollector(n, self._call, self._answer)
        self.table = QueueTable(self.durability, handles, futures,
                                scheduler_lost=self.membership.scheduler_lost,
                                settled=lambda q: self.collector.settled[q], dirpath=self.dirpath)
        self.router = Router(range(n), typed=self.config.scheduler != "fifo")
        self.sender = Sender(self.table, self.router, self.collector)
        self.outcomes = Outcomes(self.collector, self.table, consumers_running=self.has_running_consumers)
        self.follower = Follower(self, direct=direct_to_workers)
        self._init_consumer_pools()
        if self.durability == "durable":
            for q in sorted(removed_queues(self.dirpath) & set(range(n))):  # type: ignore[arg-type]
                take_out(self, q)  # drained and taken out by an earlier pool on this directory
        if not workers:
            self.follower.rest_new()
        self.follower.share_peers()

    def _call(self, q: int, method: str, *args: Any) -> Any:
        return self.table.call(q, method, *args)  # type: ignore[union-attr]

    def _answer(self, q: int, pending: Any, deadline: float | None = None) -> Any:
        return self.table.answer(q, pending, deadline)  # type: ignore[union-attr]

    # -- the queue actors ----------------------------------------------------------------------

    def queue_kwargs(self) -> dict[str, Any]:
        """Every queue actor's keyword arguments (see :func:`queue_kwargs`)."""
        return queue_kwargs(self.config, self.name, lane=self._serve_lanes)

    def actor_args(self, *, prepare: bool = True) -> tuple[type, list[tuple[Any, ...]]]:
        """The queue actor class and each queue's positional arguments (see :func:`actor_args`)."""
        return actor_args(self.config, prepare=prepare)

    def actor_spec(self, q: int) -> tuple[type, tuple[Any, ...], dict[str, Any]]:
        """``(class, args, kwargs)`` of a new actor of queue ``q`` (a successor)."""
        queue_class, queue_args = self.actor_args(prepare=False)
        return queue_class, queue_args[q], self.queue_kwargs()

    @property
    def queues(self) -> list[Any]:
        """The queue actors' handles by queue index (a removed queue's stays in its place)."""
        return [] if self.table is None else self.table.handles

    @property
    def _collector(self) -> ResultCollector:  # the spelling tests and benchmarks read
        return self.collector

    @property
    def _moving(self) -> dict[int, Any]:  # the spelling benchmarks read
        return self.table.moving

    @property
    def _membership(self) -> Any:  # the spelling benchmarks read
        return self.membership

    # -- representation -----------------------------------------------------------------------

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<QueuePool {self.name!r}: {self.n_queues} {self.durability} queues, {state}>"

    def _repr_html_(self) -> str:
        """Live counts per queue for Jupyter, within 2 s (a queue that does not answer in
        time shows as unreachable: a repr never hangs on a lost worker)."""
        from daskqueue import status

        return status.pool_html(self)

    # -- following the cluster (the membership thread) ----------------------------------------

    def on_membership(self, joined: set[str], left: set[str], retiring: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Workers joined, left or retire: see :class:`~daskqueue.queue.follow.Follower`."""
        if not self._closed:
            self.follower.on_membership(joined, left, retiring)

    def _check_open(self) -> None:
        if self._opening is not None:
            raise ConfigurationError(f"{self!r} was made with an asynchronous client: await it first "
                                     "(qp = await QueuePool(client, ...))")
        if self._closed:
            raise QueueClosedError(f"{self!r} is closed")
        not_in_client_loop(self.client)

    # -- changing the number of queues ----------------------------------------------------------

    def add_queues(self, k: int = 1) -> list[int]:
        """Add ``k`` queues to the pool (on workers without a queue first); return their indices.

        New messages are spread over every queue from now on. Keys move on the ring (see the
        README's "Routing by key"): only the keys on the arcs the new queues take over move,
        about ``k/(n+k)`` of them, and their waiting messages go with them, in put order (a
        key whose message is running keeps it where it is, and its next message waits for
        it). In a typed pool the types move the same way. Moved messages keep their ids.
        Consumers learn of the new queues at once. Raises :class:`ConfigurationError` for a
        bad ``k`` and :class:`QueueLostError` if a queue that must give up messages is lost.
        """
        self._check_open()
        return add_queues(self, k)

    def remove_queue(self, index: int, *, timeout_s: float | None = None) -> int:
        """Take queue ``index`` out of the pool; return how many of its messages moved.

        No new message goes to it from the start. Its waiting messages move to the other
        queues (keyed ones to their key's new queue, in put order; the others spread), those
        running there finish there (failures retry there, then move), its outcomes are
        fetched, and then it closes; consumers stop calling it. Its index is not reused (ids
        stay unique). Attached producers are told through the registry at once and (if a
        queue heard of one lately) get ``FOLLOW_S`` (1 s) before it closes; the records they
        have not read there (their outcomes, where their messages moved) go to another queue,
        where they read them; it never waits for a producer. Raises
        :class:`ConfigurationError` for an unknown index or the last queue, and
        :class:`JoinTimeoutError` after ``timeout_s`` while messages still run there (it
        stays out of routing; call again to finish).
        """
        self._check_open()
        moved = remove_queue(self, index, timeout_s)
        # Out for good (its outcomes fetched, its actor closed): the collector drops what it
        # still held for it (a long poll a send or a stream left in flight there).
        self.collector.forget(index)
        return moved

    # -- inspection and lifetime ----------------------------------------------------------------

    def stats(self, *, timeout_s: float | None = None) -> list[QueueStats]:
        """A :class:`QueueStats` per queue, in queue order; :class:`QueueCallTimeoutError` if a
        queue does not answer within ``timeout_s`` (default ``CALL_TIMEOUT_S``)."""
        not_in_client_loop(self.client)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self.outcomes.stats(deadline)

    def get_queue_size(self) -> dict[int, int]:
        """Unsettled messages (ready, delayed or leased) per queue index."""
        return {s.index: s.pending for s in self.stats()}

    def close(self) -> None:
        """Close every queue (waiters are woken; later calls raise ``QueueClosedError``)."""
        if self._closed:
            return
        not_in_client_loop(self.client)
        self._closed = True
        self.membership.remove_listener(self)
        lost = self.membership.scheduler_lost()
        if lost is None:
            registry.unregister_pool(self)
            failed = self.follower.close_queues()  # and releases the actors' futures
            if failed:
                logger.warning("closing queues failed: %s", failed)
        else:  # no call can reach them; they close themselves once released (orphan check)
            logger.info("closing %r with the scheduler lost (%s): its queues are not told", self, lost)
        forget(self)
        logger.info("%r closed", self)

    def __enter__(self) -> QueuePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
