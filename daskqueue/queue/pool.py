"""``QueuePool``: the client-side handle of a pool of queue actors.

The handle holds the routing table (the queue actors' handles, in routing order) and sends
batches straight to the queues, round-robin. It follows the cluster (see
:mod:`daskqueue.membership`): when a worker dies, every surviving queue takes back at once
the leases of the consumers that died with it, and a queue that died with it is known lost,
so every call that needs it raises :class:`QueueLostError` at once instead of waiting on a
dead address.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import os
import threading
import time
import uuid
import weakref
from datetime import datetime
from typing import Any, Callable, Iterable, Literal, NamedTuple, Sequence, Union

import cloudpickle
from distributed import Client

from daskqueue import atexit_close, defaults, registry
from daskqueue.errors import (
    ConfigurationError,
    JoinTimeoutError,
    NoConsumersError,
    QueueClosedError,
    QueueLostError,
    QueueMovedError,
    SchedulerLostError,
    RemoteTaskError,
    UnknownFunctionsError,
)
from daskqueue.messages import MAX_QUEUES, QUEUE_INDEX_BITS, Kind, make_id, split_id
from daskqueue.queue.base import QueueStats
from daskqueue.queue.config import Durability, FsyncPolicy, PoolConfig
from daskqueue.queue.policy import Scheduler
from daskqueue.queue.ring import HashRing
from daskqueue.queue.directory import prepare_pool_dir, queue_dir, record_removed, removed_queues
from daskqueue.queue.durable import DurableQueue
from daskqueue.queue.encode import (
    PutBatch,
    PutOptions,
    calls_from_tasks,
    chunk_size,
    encode_calls,
    encode_payloads,
    encode_keyed,
    encode_uniform,
)
from daskqueue.queue.handles import (
    LOST_CHECK_S,
    DirectActor,
    actor_lost,
    call_all,
    direct_handles,
    queue_ref,
    free_actor,
    is_lost_worker,
)
from daskqueue.queue.transient import TransientQueue
from daskqueue.segment.format import TOKEN_SIZE
from daskqueue.results import DeadLetter, MapClaim, ResultCollector, dead_letter_of
from daskqueue.serialize import encode_put, pickle_function
from daskqueue.membership import membership
from daskqueue.opening import OpensOnAwait
from daskqueue.validate import check_choice, check_number, check_optional_str

__all__ = ["QueuePool"]

#: A due time: a ``datetime`` (naive ones are local time) or seconds since the epoch.
Eta = Union[datetime, float, int, None]


def eta_epoch_s(eta: Eta) -> float:
    """Seconds since the epoch of a due time; :class:`ConfigurationError` for anything else."""
    if isinstance(eta, datetime):
        return eta.timestamp()
    if isinstance(eta, (int, float)) and not isinstance(eta, bool) and math.isfinite(eta):
        return float(eta)
    raise ConfigurationError(f"eta must be a datetime or epoch seconds, got {eta!r:.80}")

logger = logging.getLogger("daskqueue")

#: The longest time limit a message can carry (a durable queue stores it as a half float).
MAX_TIME_LIMIT_S = 65504.0


def _results_or_raise(futures: list[Any]) -> list[Any]:
    """Results of all futures; if any failed (or did not start within
    ``QUEUE_START_TIMEOUT_S``), release the others and raise the first error."""
    deadline = time.monotonic() + defaults.QUEUE_START_TIMEOUT_S
    try:
        return [f.result(timeout=max(0.0, deadline - time.monotonic())) for f in futures]
    except BaseException:
        for f in futures:
            f.release()
        raise


class _Pending(NamedTuple):
    """A call in flight to a queue, and the handle it went to (the queue may move meanwhile)."""

    future: Any
    handle: Any


def _call_payload(call: tuple[Any, ...]) -> tuple[int, Any, Any]:
    """``(kind, function, payload)`` of a ``(func, args, kwargs)`` call."""
    func, args, kwargs = call
    return (Kind.CALL_KW, func, (args, kwargs)) if kwargs else (Kind.CALL, func, args)


def _waves(keyed: list[tuple[int, PutBatch]]) -> list[list[tuple[int, PutBatch]]]:
    """Keyed batches in waves of at most one per queue, in order: a wave's puts go out at
    once, a queue's next batch only once its previous one was answered, so a key's later
    messages never get lower sequence numbers than its earlier ones."""
    waves: list[list[tuple[int, PutBatch]]] = []
    sent: dict[int, int] = {}
    for q, batch in keyed:
        k = sent.get(q, 0)
        sent[q] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append((q, batch))
    return waves


def _consecutive_runs(first_seq: int, positions: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(first seq, count, first position)`` of each run of consecutive input positions of a
    put group whose messages got the seqs from ``first_seq`` on."""
    if isinstance(positions, range) and positions.step == 1:
        return [(first_seq, len(positions), positions.start)]
    runs: list[tuple[int, int, int]] = []
    for k, p in enumerate(positions):
        if runs and runs[-1][2] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, runs[-1][2])
        else:
            runs.append((first_seq + k, 1, p))
    return runs


def _one_argument(chunk: Sequence[Any]) -> list[tuple[Any]]:
    """The payloads of a ``map`` chunk: each item is the one argument of its call."""
    return [(x,) for x in chunk]


def _not_in_client_loop(client: Client) -> None:
    """Raise :class:`ConfigurationError` if called in an asynchronous client's event loop,
    where a blocking call would wait forever for the loop it blocks."""
    if client.asynchronous:
        raise ConfigurationError("this call blocks, and it was made in the event loop of an asynchronous "
                                 "Client: use its *_async form (await qp.map_async(...), "
                                 "await cp.join_async(), async for ... in cp.as_completed_async())")


def _progress_bar(total: int) -> Any:
    """A tqdm bar for ``total`` tasks (tqdm is imported only when a bar is asked for)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="task", desc="daskqueue")


class QueuePool(OpensOnAwait):
    """A pool of ``n_queues`` queue actors on the cluster of ``client``.

    Messages are routed round-robin, one put batch at a time; a call's messages are spread
    evenly over the queues, at most ``put_batch_size`` per put.
    Every submission returns message ids; results and failures come back through
    :meth:`results` / :meth:`failures` / :meth:`result` (or as the return value of :meth:`map`).

    Parameters (all but ``client`` and ``n_queues`` keyword-only):

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

    Thread safety: use one ``QueuePool`` from one thread at a time.
    """

    def __init__(
        self,
        client: Client,
        n_queues: int = 1,
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
        self.queues: list[Any] = []
        self._removed: set[int] = set()
        self._closed = False
        self._open_now_or_on_await(client, lambda: self._open(direct_to_workers))

    def _open(self, direct_to_workers: bool | None) -> None:
        client = self.client
        self._membership = membership(client)
        queues = self._start_queues()
        if direct_to_workers is None:
            direct_to_workers = client.direct_to_workers
        self.queues = direct_handles(queues, direct=direct_to_workers)
        self._rr = itertools.count()
        n = self.config.n_queues
        self._sent_funcs: list[set[bytes]] = [set() for _ in range(n)]
        self._collector = ResultCollector(n, self._call, self._answer)
        self._put_counts = [0] * n
        # Queues taken out by remove_queue (gone) and the queues new messages go to (the
        # others, but one being drained by remove_queue).
        self._removed: set[int] = set()
        self._targets: list[int] = list(range(n))
        self._lost: dict[int, str] = {}  # queue index -> the address it was lost with
        self._moving: dict[int, threading.Event] = {}  # queues being reopened or handed off
        self._parked: dict[int, bytes] = {}  # handed-off state waiting for a worker to join
        self._awaiting_worker: set[int] = set()  # durable queues to reopen when a worker joins
        self._consumer_pools: weakref.WeakSet[Any] = weakref.WeakSet()
        # Typed pools: every message of a type goes to one queue, so that queue's count of
        # the type's running batches is the pool's (caps are exact); the queues tell each
        # other their ready counts per type (shares are pool-wide).
        self._type_ring = HashRing(range(n)) if self.config.scheduler != "fifo" else None
        self._key_ring = HashRing(range(n))  # keys= : each key to one queue
        self._slots: dict[str, int] = {}  # consumer pool id -> its running slots
        if self.durability == "durable":
            for q in sorted(removed_queues(self.dirpath) & set(range(n))):  # type: ignore[arg-type]
                self._take_out(q)  # drained and taken out by an earlier pool on this directory
        self._share_peers()
        self._membership.add_listener(self)
        registry.register_pool(self)
        atexit_close.track(self)
        from daskqueue import status

        status.install(client)  # the status page beside Dask's dashboard (never raises)
        logger.info("%r started", self)

    def _start_queues(self) -> list[Any]:
        """Start the queue actors: queue ``i`` on worker ``i mod n_workers``, only there when
        there are at least as many workers as queues (so no two share a worker)."""
        workers = self._membership.placeable()
        if not workers:
            raise ConfigurationError("the client's cluster has no workers")
        queue_class, queue_args = self._queue_actor_args()
        spread = len(workers) >= self.config.n_queues
        self._queue_futures = [
            self.client.submit(
                queue_class, *args, **self._queue_kwargs(), actor=True, pure=False,
                workers=[workers[i % len(workers)]], allow_other_workers=not spread,
            )
            for i, args in enumerate(queue_args)
        ]
        return _results_or_raise(self._queue_futures)

    def _queue_kwargs(self) -> dict[str, Any]:
        """Every queue actor's keyword arguments: the settings, and the pool's name (its load
        reports to the scheduler are counted per pool and queue)."""
        return dict(self.config.queue_kwargs(), pool=self.name)

    def _queue_actor_args(self, *, prepare: bool = True) -> tuple[type, list[tuple[Any, ...]]]:
        """The queue actor class and each queue's positional arguments; prepares a durable
        pool's directory (unless ``prepare`` is false)."""
        n = self.config.n_queues
        if self.durability == "durable":
            if not prepare:
                return DurableQueue, [(i, queue_dir(self.dirpath, i)) for i in range(n)]  # type: ignore[arg-type]
            dirs = prepare_pool_dir(self.dirpath, n, self.config.dir_mode)  # type: ignore[arg-type]
            return DurableQueue, list(enumerate(dirs))
        return TransientQueue, [(i,) for i in range(n)]

    # -- settings (all in self.config) ---------------------------------------------------------

    @property
    def n_queues(self) -> int:
        """The pool's queues now (:meth:`add_queues` adds some, :meth:`remove_queue` takes
        one away; queue indices are never reused)."""
        return len(self.queues) - len(self._removed)

    @property
    def queue_indices(self) -> list[int]:
        """The indices of the pool's queues now (a removed queue's index is not reused)."""
        return [i for i in range(len(self.queues)) if i not in self._removed]

    def _in_service(self) -> list[tuple[int, Any]]:
        """``(index, handle)`` of every queue not removed, lost or moving."""
        return [(i, h) for i, h in enumerate(self.queues)
                if i not in self._removed and i not in self._lost and i not in self._moving]

    @property
    def durability(self) -> Durability:
        return self.config.durability

    @property
    def dirpath(self) -> str | None:
        """The pool directory (absolute), or ``None`` for a transient pool."""
        return self.config.dirpath

    @property
    def lease_timeout_s(self) -> float:
        return float(self.config.lease_timeout_s)

    @property
    def max_message_bytes(self) -> int:
        """The largest pickled message a queue accepts (for a durable pool, what also fits in a
        log segment)."""
        return self.config.message_limit()

    @property
    def put_batch_size(self) -> int:
        return self.config.put_batch_size

    # -- representation -----------------------------------------------------------------------

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<QueuePool {self.name!r}: {self.n_queues} {self.durability} queues, {state}>"

    def _repr_html_(self) -> str:
        """Live counts per queue for Jupyter, within 2 s (a queue that does not answer in
        time shows as unreachable: a repr never hangs on a lost worker)."""
        from daskqueue import status

        return status.pool_html(self)

    # -- submitting tasks ---------------------------------------------------------------------

    def submit(self, func: Callable[..., Any], *args: Any, dq_type: str | None = None, dq_priority: int = 0,
               dq_key: str | None = None, dq_delay_s: float = 0.0, dq_eta: Eta = None,
               dq_time_limit_s: float | None = None, **kwargs: Any) -> int:
        """Enqueue ``func(*args, **kwargs)``; return its task id.

        The ``dq_`` keywords are the message's own options (the others go to ``func``): its
        ``type``, ``priority``, routing ``key``, and a delay (``dq_delay_s``) or a due time
        (``dq_eta``, a ``datetime`` or epoch seconds) before which it does not run, and
        ``dq_time_limit_s``: how long it may run (see :meth:`batch_submit`).
        """
        options = self._put_options(dq_type, dq_priority, dq_key, dq_delay_s, dq_eta, dq_time_limit_s)
        return self._send(encode_calls([(func, args, kwargs)], options, **self._encoding(1, options)), n=1,
                          queue=self._route(options))[0]

    def batch_submit(
        self,
        tasks: Iterable[Sequence[Any]],
        *,
        type: str | None = None,
        priority: int = 0,
        key: str | None = None,
        delay_s: float = 0.0,
        eta: Eta = None,
        keys: Sequence[str] | None = None,
        time_limit_s: float | None = None,
    ) -> list[int]:
        """Enqueue tasks given as tuples ``(func, *args)``; return their ids, in order.

        Every task is validated and pickled before anything is sent: an unpicklable or
        non-callable task raises (naming its index) and enqueues nothing. Each distinct
        function is pickled once per call. ``keys`` (one per task): tasks with the same key
        go to one queue and run one at a time, in this order (see the README's "Routing by
        key"). ``time_limit_s`` (default: the pool's): a task still running after that long is
        interrupted and counts as a failed attempt (see the README's "Time limits").
        """
        options = self._put_options(type, priority, key, delay_s, eta, time_limit_s)
        tasks = tasks if isinstance(tasks, list) else list(tasks)
        if keys is not None:
            calls = calls_from_tasks(tasks)
            return self._send_keyed(options, self._check_keys(keys, len(tasks), key),
                                    lambda i: _call_payload(calls[i]), what="arguments")
        encoding = self._encoding(len(tasks), options)
        batches = encode_uniform(tasks, options, **encoding)
        if batches is None:
            batches = encode_calls(calls_from_tasks(tasks), options, **encoding)
        return self._send(batches, n=len(tasks), queue=self._route(options))

    def map(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Any],
        *,
        progress: bool = False,
        timeout_s: float | None = None,
        errors: Literal["raise", "return"] = "raise",
        priority: int = 0,
        type: str | None = None,
        delay_s: float = 0.0,
        eta: Eta = None,
        key: Callable[[Any], str] | None = None,
        time_limit_s: float | None = None,
    ) -> list[Any]:
        """Run ``func(x)`` for each ``x`` on the cluster; return the results in input order.

        Needs a started ``ConsumerPool`` on this pool. ``progress=True`` shows a tqdm bar with
        done / failed / rate. A task that fails on its last retry: with ``errors="raise"`` the
        first such :class:`RemoteTaskError` (by input position) is raised once every task is
        settled; with ``errors="return"`` it takes the task's place in the list. Raises
        :class:`JoinTimeoutError` after ``timeout_s``.
        """
        check_choice("errors", errors, ("raise", "return"))
        options = self._put_options(type, priority, None, delay_s, eta, time_limit_s)
        if not self._has_running_consumers():
            raise NoConsumersError(f"map() needs a started ConsumerPool on {self!r}: create one "
                                   "and call start() first")
        started = time.monotonic()
        items = list(iterable)
        keyed = None
        if key is not None:
            if not callable(key):
                raise ConfigurationError(f"key must be a callable item -> str, got {key!r:.80}")
            keyed = self._keyed_batches(options, self._check_keys([key(x) for x in items], len(items)),
                                        lambda i: (Kind.CALL, func, (items[i],)), what="argument")
        else:
            batches = encode_payloads(
                items, _one_argument, kind=Kind.CALL, function=pickle_function(func), options=options,
                what="argument", **self._encoding(len(items), options),
            )
        claim = MapClaim(len(items))
        bar = _progress_bar(claim.n) if progress else None
        try:
            if keyed is not None:
                for wave in _waves(keyed):
                    self._send([b for _, b in wave], claim=claim, queues=[q for q, _ in wave])
            else:
                self._send(batches, claim=claim, queue=self._route(options))
            deadline = None if timeout_s is None else started + timeout_s
            return self._wait_map(claim, bar=bar, deadline=deadline, timeout_s=timeout_s, errors=errors)
        finally:
            self._collector.release(claim)
            if bar is not None:
                bar.close()

    def _wait_map(
        self,
        claim: MapClaim,
        *,
        bar: Any,
        deadline: float | None,
        timeout_s: float | None,
        errors: str,
    ) -> list[Any]:
        shown = 0
        while not claim.complete:
            arrived = self.poll_outcomes()
            # Checked on every pass, not only when nothing arrived: a long map that keeps
            # completing tasks must still time out.
            if not claim.complete and deadline is not None and time.monotonic() > deadline:
                counts = {
                    "done": claim.settled - len(claim.failures),
                    "failed": len(claim.failures),
                    "pending": claim.n - claim.settled,
                }
                raise JoinTimeoutError(timeout_s or 0.0, counts)
            if arrived == 0:
                self._check_scheduler()
                time.sleep(defaults.POLL_INTERVAL_S)
            if bar is not None and claim.settled > shown:
                bar.update(claim.settled - shown)
                bar.set_postfix(failed=len(claim.failures), refresh=False)
                shown = claim.settled
        if claim.failures:
            if errors == "raise":
                raise claim.failures[min(claim.failures)]
            for position, error in claim.failures.items():
                claim.values[position] = error
        return claim.values

    # -- raw items ----------------------------------------------------------------------------

    def put(self, item: Any, *, type: str | None = None, priority: int = 0, key: str | None = None,
            delay_s: float = 0.0, eta: Eta = None, time_limit_s: float | None = None) -> int:
        """Enqueue one raw item for a custom consumer; return its message id."""
        return self.put_many([item], type=type, priority=priority, key=key, delay_s=delay_s, eta=eta,
                             time_limit_s=time_limit_s)[0]

    def put_many(self, items: Iterable[Any], *, type: str | None = None, priority: int = 0,
                 key: str | None = None, delay_s: float = 0.0, eta: Eta = None,
                 keys: Sequence[str] | None = None, time_limit_s: float | None = None) -> list[int]:
        """Enqueue raw items (each pickled on its own) for a custom consumer; return their ids.

        Every enqueue call takes the same message options: ``type`` (what a fair or capped
        pool schedules by), ``priority`` (higher first), ``key``, and ``delay_s`` or ``eta``
        (a ``datetime`` or epoch seconds): the messages do not run before then.
        """
        options = self._put_options(type, priority, key, delay_s, eta, time_limit_s)
        items = list(items)
        if keys is not None:
            return self._send_keyed(options, self._check_keys(keys, len(items), key),
                                    lambda i: (Kind.RAW, None, items[i]), what="item")
        batches = encode_payloads(
            items, None, kind=Kind.RAW, function=None, options=options, what="item",
            **self._encoding(len(items), options),
        )
        return self._send(batches, n=len(items), queue=self._route(options))

    # -- encoding and sending -----------------------------------------------------------------

    def _put_options(self, type: str | None = None, priority: int = 0, key: str | None = None,
                     delay_s: float = 0.0, eta: Eta = None, time_limit_s: float | None = None) -> PutOptions:
        """The validated options of a submission; raises :class:`QueueClosedError` first if
        the pool is closed."""
        self._check_open()
        # Durable queues store the priority in 32 bits.
        check_number("priority", priority, integer=True, at_least=-(2**31), at_most=2**31 - 1)
        check_number("delay_s", delay_s, at_least=0)
        if key is not None and self._type_ring is not None:
            raise ConfigurationError(f"key= routes messages by key; a {self.config.scheduler!r} pool routes "
                                     "them by type: use keys in a 'fifo' pool")
        due_epoch = 0.0
        if eta is not None:
            if delay_s:
                raise ConfigurationError("give delay_s or eta, not both")
            due_epoch = eta_epoch_s(eta)
        if time_limit_s is None:
            time_limit_s = self.time_limit_s
        check_number("time_limit_s", time_limit_s, above=0, at_most=MAX_TIME_LIMIT_S, none_ok=True)
        return PutOptions(check_optional_str("type", type), priority, check_optional_str("key", key),
                          float(delay_s), due_epoch, float(time_limit_s or 0.0))

    def _encoding(self, n: int, options: PutOptions) -> dict[str, int]:
        """The chunk size and message size limit of a submission of ``n`` messages (the
        encoders' ``size`` and ``limit``)."""
        spread = len(self._targets) if self._route(options) is None else 1
        return {
            "size": chunk_size(n, n_queues=spread, put_batch_size=self.put_batch_size),
            "limit": self.config.message_limit(options.type, options.key),
        }

    def _check_keys(self, keys: Sequence[Any], n: int, key: str | None = None) -> list[str]:
        """The per-message routing keys of a submission of ``n`` messages, validated."""
        if key is not None:
            raise ConfigurationError("give key= (one key for every message) or keys=, not both")
        if self._type_ring is not None:
            raise ConfigurationError(f"keys= routes messages by key; a {self.config.scheduler!r} pool routes "
                                     "them by type: use keys in a 'fifo' pool")
        keys = list(keys)
        if len(keys) != n:
            raise ConfigurationError(f"keys has {len(keys)} keys for {n} messages")
        for i, k in enumerate(keys):
            if not isinstance(k, str):
                raise ConfigurationError(f"key {i} must be a str, got {k!r:.80}")
        return keys

    def _keyed_batches(self, options: PutOptions, keys: list[str], payload_of: Callable[[int], Any],
                       what: str) -> list[tuple[int, PutBatch]]:
        return encode_keyed(keys, self._key_ring.node, payload_of, options,
                            size=self.put_batch_size, limit=self.config.message_limit(options.type), what=what)

    def _send_keyed(self, options: PutOptions, keys: list[str], payload_of: Callable[[int], Any],
                    what: str) -> list[int]:
        """Encode messages by key (each to its key's queue on the ring) and send them."""
        ids = [0] * len(keys)
        for wave in _waves(self._keyed_batches(options, keys, payload_of, what)):
            self._send([b for _, b in wave], n=len(keys), queues=[q for q, _ in wave], into=ids)
        return ids

    def _route(self, options: PutOptions) -> int | None:
        """The queue every message of a submission goes to (a typed pool's queue for its
        type; a key's queue when all of them have one ``key=``), or None: round-robin."""
        if self._type_ring is not None:
            return self._type_ring.node(options.type)
        return None if options.key is None else self._key_ring.node(options.key)

    def _send(self, batches: list[PutBatch], *, n: int = 0, claim: MapClaim | None = None,
              queue: int | None = None, queues: list[int] | None = None, into: list[int] | None = None) -> list[int]:
        """Send every encoded batch (all encoded before any is sent), round-robin (or all to
        ``queue``, or batch ``i`` to ``queues[i]``), concurrently; return the ids of the ``n``
        messages by input position (with ``claim``, route their results to it instead and
        return nothing)."""
        sends = []
        for i, (groups, funcs, positions) in enumerate(batches):
            if queues is not None:
                q = queues[i]
            else:
                q = self._targets[next(self._rr) % len(self._targets)] if queue is None else queue
            # A function confirmed at a queue is not sent to it again.
            extra = {d: b for d, b in funcs.items() if d not in self._sent_funcs[q]}
            blob, token = encode_put(groups, extra), os.urandom(TOKEN_SIZE)
            sends.append((q, groups, funcs, positions, blob, token, self._call(q, "put_batch", blob, token)))
        ids = [0] * n if into is None else into
        for q, groups, funcs, positions, blob, token, future in sends:
            try:
                allocated = self._put_answer(q, future, blob, token)
            except UnknownFunctionsError as e:  # the queue evicted them: once more, carrying them
                for digest in e.digests:
                    self._sent_funcs[q].discard(digest)
                blob = encode_put(groups, funcs)
                allocated = self._put_answer(q, self._call(q, "put_batch", blob, token), blob, token)
            self._put_counts[q] += sum(g.count for g in groups)
            self._sent_funcs[q].update(g.digest for g in groups if g.digest is not None)
            for (first_seq, count), pos in zip(allocated, positions):
                if claim is not None:
                    for run_seq, run_count, run_pos in _consecutive_runs(first_seq, pos):
                        self._collector.claim(q, run_seq, run_count, claim, run_pos)
                elif isinstance(pos, range) and pos.step == 1:
                    ids[pos.start : pos.stop] = [
                        (s << QUEUE_INDEX_BITS) | q for s in range(first_seq, first_seq + count)
                    ]
                else:
                    for k, p in enumerate(pos):
                        ids[p] = make_id(q, first_seq + k)
        return ids

    def _put_answer(self, q: int, pending: _Pending, blob: bytes, token: bytes) -> Any:
        """The answer to a put; if the queue moved meanwhile (its answer may be lost), the same
        put again where it moved, with the same token: a queue that stored it already answers
        with the ids it gave and stores nothing, so the put is neither lost nor stored twice."""
        for _ in range(defaults.PUT_ATTEMPTS - 1):
            try:
                return self._answer(q, pending)
            except QueueMovedError:
                self._await_move(q, pending.handle)
                logger.info("queue %d moved while a put was in flight; putting again there", q)
                pending = self._call(q, "put_batch", blob, token)
        return self._answer(q, pending)

    def _call(self, q: int, method: str, *args: Any) -> Any:
        """Call ``method`` of queue ``q``; its future. Dask refuses a call to an actor whose
        worker it knows to be dead right here, so that is translated too."""
        handle = self._current(q)
        try:
            return _Pending(getattr(handle, method)(*args), handle)
        except Exception as e:
            if not (self.durability == "durable" and is_lost_worker(e)):
                self._raise_if_lost(q, e, handle)
                raise
        # Dask knew of the death before the pool did: wait for the move, then call there.
        self._await_move(q, handle)
        handle = self._current(q)
        try:
            return _Pending(getattr(handle, method)(*args), handle)
        except Exception as e:
            self._raise_if_lost(q, e, handle)
            raise

    def _await_move(self, q: int, handle: Any) -> None:
        """Wait (bounded) until durable queue ``q`` has moved away from ``handle`` or is lost."""
        deadline = time.monotonic() + defaults.MOVE_WAIT_S
        while self.queues[q] is handle and q not in self._lost and time.monotonic() < deadline:
            self._check_scheduler()
            time.sleep(defaults.POLL_INTERVAL_S)

    def _current(self, q: int) -> Any:
        """Queue ``q``'s handle; while a durable queue is being reopened elsewhere, wait for it
        (bounded). Raises :class:`QueueLostError` for a queue that is gone."""
        moving = self._moving.get(q)
        if moving is not None:
            deadline = time.monotonic() + defaults.MOVE_WAIT_S
            while not moving.wait(LOST_CHECK_S):
                self._check_scheduler()
                if time.monotonic() > deadline:  # still recovering: ask again later
                    raise QueueMovedError(q, self.queues[q]._address)
        if q in self._lost:
            raise self._lost_error(q)
        return self.queues[q]

    def _answer(self, q: int, pending: _Pending) -> Any:
        """The result of a call to queue ``q``, with a lost worker as :class:`QueueLostError`.

        Waits in slices, checking whether Dask has marked the queue lost: in distributed
        2026.8 a call in flight when the actor's worker dies can stay unanswered for good (its
        retry awaits the lost key's future inside a callback that then never sets the result).
        """
        future, handle = pending
        while True:
            try:
                return future.result(timeout=LOST_CHECK_S)
            except TimeoutError as e:
                if future.done():  # answered as the wait timed out (or a remote TimeoutError)
                    return future.result()
                self._check_scheduler()
                if self._gone(q, handle):
                    raise self._lost_error(q, handle) from e
            except Exception as e:
                self._check_scheduler()
                self._raise_if_lost(q, e, handle)
                raise

    def _check_scheduler(self) -> None:
        """Raise :class:`SchedulerLostError` if the client has lost its scheduler: every
        queue went with the workers, so no wait for one may go on."""
        status = self._membership.scheduler_lost()
        if status is not None:
            raise SchedulerLostError(status, self.dirpath)

    def _gone(self, q: int, handle: Any) -> bool:
        """Whether ``handle`` no longer stands for a live queue ``q`` (lost, or moved away)."""
        return q in self._lost or q in self._moving or handle is not self.queues[q] or actor_lost(handle)

    def _raise_if_lost(self, q: int, error: BaseException, handle: Any) -> None:
        """Raise :class:`QueueLostError` from ``error`` if it says queue ``q``'s worker is gone."""
        if is_lost_worker(error):
            raise self._lost_error(q, handle) from error

    def _lost_error(self, q: int, handle: Any = None) -> QueueLostError:
        """The error for a call to lost queue ``q`` (through ``handle``). A durable queue is
        reopened elsewhere: a call in flight to the old actor gets :class:`QueueMovedError`.
        A transient one's error says how many messages went with it (put there, and no
        outcome received by this client)."""
        handle = self.queues[q] if handle is None else handle
        if self.durability == "durable" and q not in self._lost:
            return QueueMovedError(q, handle._address)
        lost = None
        if self.durability == "transient":
            lost = max(0, self._put_counts[q] - self._collector.settled[q])
        return QueueLostError(q, handle._address, self.durability, lost)

    # -- following the cluster (the membership thread) ----------------------------------------

    def _attach(self, consumer_pool: Any) -> None:
        """A ``ConsumerPool`` works on this pool (``map`` checks one is running)."""
        self._consumer_pools.add(consumer_pool)

    def _has_running_consumers(self) -> bool:
        return any(cp.running for cp in list(self._consumer_pools))

    def on_membership(self, joined: set[str], left: set[str], retiring: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Workers retire: their queues hand their state to successors elsewhere. Workers
        left: the queues there are lost (a durable one is reopened elsewhere); every other
        queue takes back at once the leases of the consumers that were there (an attempt each)."""
        if self._closed:
            return
        if retiring:
            # Consumers there settle first, with their queues still in place: a queue with
            # nowhere to go waits in the client, where no settlement can reach it.
            for cp in list(self._consumer_pools):
                cp._let_go_retiring(retiring)
        for q, handle in enumerate(self.queues):
            if handle._address in retiring and q not in self._lost and q not in self._moving and q not in self._removed:
                self._hand_off(q)
        if joined and self._parked:
            self._unpark()
        if joined and self._awaiting_worker:
            for q in sorted(self._awaiting_worker):
                self._awaiting_worker.discard(q)
                self._reopen(q)
        if not left:
            return
        reopen = []
        for q, handle in enumerate(self.queues):
            if handle._address not in left or q in self._lost or q in self._parked or q in self._removed:
                continue
            if self.durability == "durable":
                self._moving[q] = threading.Event()
                reopen.append(q)
                logger.warning("queue %d of %r was lost with its worker %s; reopening it elsewhere",
                               q, self, handle._address)
            else:
                self._lost[q] = handle._address
                logger.error("queue %d of %r was lost with its worker %s", q, self, handle._address)
        try:
            alive = [(f"queue {q}", h) for q, h in self._in_service()]
            failed = call_all(alive, "workers_lost", sorted(left), timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
            if failed:
                logger.warning("taking back the leases of lost workers failed: %s", failed)
        finally:  # a queue marked moving must be reopened (or given up), whatever happened
            for q in reopen:
                self._reopen(q)

    def _reopen(self, q: int) -> None:
        """Reopen durable queue ``q`` from its directory on a surviving worker (one without a
        queue if there is one) and move every handle to it: this pool's, its result
        collector's (same cursors: result numbering is on disk) and its consumers'. With no
        worker to take it now (every worker died at once, and their replacements have not
        joined yet), it waits for the next worker to join; calls to it wait meanwhile."""
        if not self._placeable_for(q):
            self._awaiting_worker.add(q)
            logger.warning("queue %d of %r: no worker can take it now; reopening it when one joins", q, self)
            return
        try:
            handle, future = self._start_successor(q)
        except BaseException as e:
            logger.error("queue %d could not be reopened (%s); it stays lost", q, e)
            self._give_up(q)
            return
        self._install(q, handle, future)
        logger.warning("queue %d of %r reopened on %s", q, self, handle._address)

    def _hand_off(self, q: int) -> None:
        """Move queue ``q`` off its retiring worker: the queue stops serving and hands over
        its state (a durable queue: its live leases; the rest is on disk), a successor takes
        it on another worker, and every handle moves there. Calls made meanwhile wait for
        the move; calls the old queue refused are made again at the successor."""
        old = self.queues[q]
        self._moving[q] = threading.Event()
        try:
            state = old.hand_off().result(timeout=defaults.CONTROL_CALL_TIMEOUT_S)
        except Exception as e:  # it still serves: retirement will refuse its worker
            logger.error("queue %d of %r could not hand off from %s: %s: %s", q, self, old._address,
                         type(e).__name__, e)
            self._moving.pop(q).set()
            return
        if not self._placeable_for(q):
            self._park(q, state)
            return
        for attempt in range(2):
            try:
                handle, future = self._start_successor(q, state)
                break
            except BaseException as e:
                logger.warning("queue %d: starting its successor failed (%s: %s)", q, type(e).__name__, e)
        else:
            if self.durability == "durable":
                self._reopen(q)  # its leases come back ready (rule 6); nothing else is lost
            else:
                logger.error("queue %d of %r: no successor could take its state; its messages are lost", q, self)
                self._give_up(q)
            return
        self._install(q, handle, future)
        logger.info("queue %d of %r moved from retiring worker %s to %s", q, self, old._address, handle._address)

    def _placeable_for(self, q: int) -> list[str]:
        """Workers a new actor of queue ``q`` may go to, those without a queue first."""
        busy = {h._address for i, h in enumerate(self.queues) if i != q and i not in self._parked and i not in self._removed}
        workers = [w for w in self._membership.placeable() if w != self.queues[q]._address]
        return [w for w in workers if w not in busy] or workers

    def _park(self, q: int, state: bytes) -> None:
        """No other worker can take queue ``q`` now (every worker is retiring: jobs that
        reached their walltime together): keep its handed-off state here, free the old actor
        so its worker may retire, and start the successor on the next worker that joins.
        Calls to the queue wait meanwhile, as for any move."""
        self._parked[q] = state
        free_actor(self._queue_futures[q], self.queues[q])
        logger.warning("queue %d of %r: no worker can take it now; its state waits in the client "
                       "for the next worker to join", q, self)

    def _unpark(self) -> None:
        """Workers joined: start the parked queues there."""
        for q in sorted(self._parked):
            if not self._placeable_for(q):
                return
            try:
                handle, future = self._start_successor(q, self._parked[q])
            except BaseException as e:
                logger.warning("queue %d: starting its successor failed (%s: %s); it waits for "
                               "another worker", q, type(e).__name__, e)
                continue
            del self._parked[q]
            self._install(q, handle, future)
            logger.warning("queue %d of %r started on %s with its parked state", q, self, handle._address)

    def _start_successor(self, q: int, handoff: bytes | None = None) -> tuple[Any, Any]:
        """Start a new actor for queue ``q`` on a worker that may hold one (one without a
        queue if there is one), with the ``handoff`` of its previous actor if it has one."""
        free = self._placeable_for(q)
        if not free:
            raise QueueLostError(q, self.queues[q]._address, self.durability)
        queue_class, queue_args = self._queue_actor_args(prepare=False)
        state = None if handoff is None else self.client.scatter(handoff, workers=free[:1])
        future = self.client.submit(
            queue_class, *queue_args[q], **self._queue_kwargs(), handoff=state,
            actor=True, pure=False, workers=free, allow_other_workers=False,
        )
        try:
            handle = future.result(timeout=defaults.QUEUE_START_TIMEOUT_S)
        finally:
            if state is not None:
                state.release()
        direct = isinstance(self.queues[q], DirectActor)
        return direct_handles([handle], direct=direct)[0], future

    def _install(self, q: int, handle: Any, future: Any) -> None:
        """Queue ``q`` lives at ``handle`` from now on: route there, free the old actor (its
        worker may then retire), and point every consumer there."""
        if self._closed:  # closed meanwhile: the new actor must not keep the directory locked
            call_all([(f"queue {q}", handle)], "close", timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
            future.release()
            self._give_up(q)
            return
        old, old_handle = self._queue_futures[q], self.queues[q]
        self.queues[q], self._queue_futures[q] = handle, future
        self._sent_funcs[q] = set()
        self._moving.pop(q).set()
        free_actor(old, old_handle)
        for cp in list(self._consumer_pools):
            cp._queue_moved(q, handle)
        self._share_peers()
        registry.register_pool(self)

    def _share_peers(self) -> None:
        """Tell every queue where the others are (they announce to each other when they
        have work) and, in a typed pool, the consumer pools' slots: at start, and after a
        queue moved (its successor starts knowing nothing). Every queue gets it, a pool's
        only one too: the call starts its housekeeping."""
        refs = [None if i in self._removed else queue_ref(h) for i, h in enumerate(self.queues)]
        live = [(f"queue {i}", h) for i, h in self._in_service()]
        failed = call_all(live, "set_peers", refs, timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
        for owner, slots in list(self._slots.items()):
            failed += call_all(live, "set_slots", owner, slots, timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
        if failed:
            logger.warning("telling the queues their peers and slots failed: %s", failed)

    def _set_slots(self, owner: str, slots: int) -> None:
        """Consumer pool ``owner`` runs ``slots`` batches at once (0: stopped or closed)."""
        if self._type_ring is None or self._slots.get(owner, 0) == slots:
            return
        self._slots[owner] = slots
        if not slots:
            del self._slots[owner]
        live = [(f"queue {i}", h) for i, h in self._in_service()]
        failed = call_all(live, "set_slots", owner, slots, timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
        if failed:
            logger.warning("telling the queues the consumers' slots failed: %s", failed)

    def _give_up(self, q: int) -> None:
        """Queue ``q`` is lost for good: every call that needs it raises QueueLostError."""
        self._lost[q] = self.queues[q]._address
        moving = self._moving.pop(q, None)
        if moving is not None:
            moving.set()

    def _check_open(self) -> None:
        if self._opening is not None:
            raise ConfigurationError(f"{self!r} was made with an asynchronous client: await it first "
                                     "(qp = await QueuePool(client, ...))")
        if self._closed:
            raise QueueClosedError(f"{self!r} is closed")
        _not_in_client_loop(self.client)

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
        check_number("k", k, integer=True, at_least=1, at_most=MAX_QUEUES - len(self.queues))
        old = len(self.queues)
        new = list(range(old, old + k))
        config = dataclasses.replace(self.config, n_queues=old + k)
        previous, self.config = self.config, config
        try:
            queue_class, queue_args = self._queue_actor_args()
        except BaseException:
            self.config = previous
            raise
        workers = self._membership.placeable()
        busy = {h._address for i, h in enumerate(self.queues) if i not in self._removed}
        free = [w for w in workers if w not in busy] or workers
        futures = [
            self.client.submit(queue_class, *queue_args[q], **self._queue_kwargs(), actor=True, pure=False,
                               workers=[free[j % len(free)]], allow_other_workers=len(free) < k)
            for j, q in enumerate(new)
        ]
        try:
            handles = _results_or_raise(futures)
        except BaseException:
            self.config = previous
            raise
        direct = isinstance(self.queues[0], DirectActor)
        self.queues += direct_handles(handles, direct=direct)
        self._queue_futures += futures
        self._sent_funcs += [set() for _ in new]
        self._put_counts += [0] * k
        self._collector.add_queues(k)
        self._share_peers()
        nodes = self._targets + new
        for cp in list(self._consumer_pools):
            cp._queues_changed()
        moved = self._move_from([q for q in self._targets if q not in self._lost], nodes, everything=False)
        self._route_to(nodes)
        registry.register_pool(self)
        logger.info("%r: added queues %s; %d waiting messages moved to them", self, new, moved)
        return new

    def remove_queue(self, index: int, *, timeout_s: float | None = None) -> int:
        """Take queue ``index`` out of the pool; return how many of its messages moved.

        No new message goes to it from the start. Its waiting messages move to the other
        queues (keyed ones to their key's new queue, in put order; the others spread), those
        running there finish there (failures retry there, then move), its outcomes are
        fetched, and then it closes; consumers stop calling it. Its index is not reused (ids
        stay unique). Raises :class:`ConfigurationError` for an unknown index or the last
        queue, and :class:`JoinTimeoutError` after ``timeout_s`` while messages still run
        there (it stays out of routing; call again to finish).
        """
        self._check_open()
        check_number("index", index, integer=True, at_least=0)
        if index >= len(self.queues) or index in self._removed:
            raise ConfigurationError(f"{self!r} has no queue {index} (its queues: {self.queue_indices})")
        if index in self._lost:
            raise self._lost_error(index)
        nodes = [q for q in self._targets if q != index]
        if not nodes:
            raise ConfigurationError(f"queue {index} is the last queue of {self!r}: close the pool instead")
        self._route_to(nodes)
        for cp in list(self._consumer_pools):
            cp._queues_changed()  # homes move off it; it is still served until it is drained
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        moved = 0
        while True:
            moved += self._move_from([index], nodes, everything=True)
            s = self._answer_or_ask_again(index, self._call(index, "stats"), "stats")
            if s.pending == 0:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise JoinTimeoutError(timeout_s or 0.0, {"ready": s.ready, "delayed": s.delayed, "leased": s.leased})
            self._check_scheduler()
            time.sleep(defaults.MOVE_POLL_S)
        self.poll_outcomes(queue_index=index)  # every outcome it holds, before it goes
        self._take_out(index)
        if self.durability == "durable":
            record_removed(self.dirpath, index)  # type: ignore[arg-type]
        self._share_peers()
        registry.register_pool(self)
        for cp in list(self._consumer_pools):
            cp._queues_changed()
        logger.info("%r: queue %d removed; %d of its messages moved to the others", self, index, moved)
        return moved

    def _take_out(self, q: int) -> None:
        """Queue ``q`` is drained: close its actor and forget it (its index stays taken)."""
        failed = call_all([(f"queue {q}", self.queues[q])], "close", timeout_s=defaults.STOP_TIMEOUT_S)
        if failed:
            logger.warning("closing removed queue %d failed: %s", q, failed)
        free_actor(self._queue_futures[q], self.queues[q])
        self._removed.add(q)
        self._collector.removed.add(q)
        self._route_to([i for i in self._targets if i != q])

    def _route_to(self, nodes: list[int]) -> None:
        """New messages go to queues ``nodes`` from now on (keys and types by the ring)."""
        self._targets = list(nodes)
        self._key_ring = HashRing(nodes)
        if self._type_ring is not None:
            self._type_ring = HashRing(nodes)

    def _move_from(self, sources: list[int], nodes: list[int], *, everything: bool) -> int:
        """Have queues ``sources`` hand the messages the ring of ``nodes`` routes elsewhere
        to their queues (all of them with ``everything``); record the moves so that their
        outcomes come back under their old ids; return how many moved. A destination that
        did not answer is asked again (the move is idempotent); still failing, raises
        :class:`QueueLostError` for that source."""
        typed = self._type_ring is not None
        total = 0
        for attempt in range(defaults.PUT_ATTEMPTS):
            calls = [(q, self._call(q, "move_out", nodes, typed, everything)) for q in sources]
            retry = []
            for q, pending in calls:
                runs, failed = self._answer_or_ask_again(q, pending, "move_out", nodes, typed, everything)
                self._collector.moved(runs, q)
                for _, count, dest, _ in runs:
                    self._put_counts[q] -= count
                    self._put_counts[dest] += count
                    total += count
                if failed:
                    logger.warning("queue %d: moving messages failed (%s); trying again", q, "; ".join(failed))
                    retry.append(q)
            if not retry:
                return total
            sources = retry
        raise QueueLostError(sources[0], self.queues[sources[0]]._address, self.durability)

    # -- outcomes -----------------------------------------------------------------------------
    #
    # The pool created the ids, so it owns what comes back for them: results ride on the
    # consumers' acks into the queues, and a ResultCollector fetches them with a cursor per
    # queue. Results of map() go to the map call that is waiting, not to results().

    def poll_outcomes(self, *, wait_s: float = 0.0, queue_index: int | None = None) -> int:
        """Fetch the results and dead letters the queues hold (one call per queue, or to queue
        ``queue_index`` only); return how many arrived.

        With ``wait_s``, a queue with nothing new holds the call until an outcome arrives or
        ``wait_s`` passes (a long poll). Thread-safe: polls run one at a time. Raises
        :class:`QueueLostError` for a queue whose worker is gone.
        """
        _not_in_client_loop(self.client)
        return self._collector.poll(wait_s=wait_s, queue_index=queue_index)

    def results(self, *, clear: bool = False) -> dict[int, Any]:
        """``{task_id: return value}`` of every task acked so far (fetched now; a copy).

        The pool keeps every result until it is taken: with ``clear=True`` the results
        returned are forgotten (the next call returns only newer ones). For millions of tasks
        use ``ConsumerPool.as_completed`` (or ``clear=True``) so that client memory stays flat.
        """
        self.poll_outcomes()
        if not clear:
            return dict(self._collector.results)
        return self._collector.take_all("results")

    def failures(self, *, clear: bool = False) -> dict[int, RemoteTaskError]:
        """``{task_id: RemoteTaskError}`` of every task dead-lettered so far (fetched now; a
        copy); ``clear=True`` forgets those returned, as for :meth:`results`."""
        self.poll_outcomes()
        if not clear:
            return dict(self._collector.failures)
        return self._collector.take_all("failures")

    def result(self, task_id: int, timeout_s: float | None = None) -> Any:
        """The return value of task ``task_id``, waiting for it (long-polling its queue).

        Raises its :class:`RemoteTaskError` if it was dead-lettered, and
        :class:`JoinTimeoutError` if it is not settled within ``timeout_s`` seconds.
        """
        check_number("task_id", task_id, integer=True, at_least=0)
        queue_index, _ = split_id(task_id)
        if queue_index >= len(self.queues):
            raise ConfigurationError(f"task_id {task_id} names queue {queue_index}; {self!r} has {len(self.queues)}")
        if self._collector.has_moves() or queue_index in self._removed:
            queue_index = None  # its outcome may come from the queue it moved to
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            known, value = self._collector.outcome(task_id)
            if known:
                if isinstance(value, RemoteTaskError) and task_id in self._collector.failures:
                    raise value
                return value
            left = defaults.RESULT_POLL_SLICE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise JoinTimeoutError(timeout_s or 0.0, {"pending": 1})
            self.poll_outcomes(wait_s=min(left, defaults.RESULT_POLL_SLICE_S) if queue_index is not None else 0.0,
                               queue_index=queue_index)
            if queue_index is None:
                time.sleep(defaults.POLL_INTERVAL_S)

    # -- dead letters -----------------------------------------------------------------------------

    def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        """The dead-lettered messages (at most ``limit``, oldest first per queue), with their
        payload, error, attempts and when they died. Durable queues keep them across restarts."""
        self._check_open()
        check_number("limit", limit, integer=True, at_least=0, none_ok=True)
        calls = [(q, self._call(q, "dead_letters", limit)) for q in self.queue_indices if q not in self._lost]
        rows = [(q, row) for q, pending in calls
                for row in self._answer_or_ask_again(q, pending, "dead_letters", limit)]
        digests: dict[int, set[bytes]] = {}
        for q, row in rows:
            if row[5] is not None:
                digests.setdefault(q, set()).add(row[5])
        funcs: dict[bytes, Any] = {}
        for q, wanted in digests.items():
            blobs = self._answer_or_ask_again(q, self._call(q, "get_functions", sorted(wanted)),
                                              "get_functions", sorted(wanted))
            for digest, blob in blobs.items():
                try:
                    funcs[digest] = cloudpickle.loads(blob)
                except Exception as e:
                    logger.debug("dead letters: function %s not loadable here: %s", digest.hex()[:12], e)
        out = [dead_letter_of(q, row, funcs) for q, row in rows]
        return out if limit is None else out[:limit]

    def replay_dead(self, ids: Iterable[int] | None = None) -> int:
        """Put dead-lettered messages (all, or those with these ids) back as ready, attempts
        reset; return how many. Their outcomes come back under their old ids (their failure
        is forgotten meanwhile): ``result(id)`` waits for the new run."""
        self._check_open()
        by_queue = self._ids_by_queue(ids)
        calls = [(q, self._call(q, "replay_dead", seqs)) for q, seqs in by_queue.items()]
        n = 0
        for q, pending in calls:
            runs = self._answer(q, pending)
            old = [make_id(*self._collector._pieces(q, s, 1)[0][:2]) for s, _, _, _ in runs]
            self._collector.forget_failures(old)
            self._collector.moved(runs, q)
            n += len(runs)
        logger.info("%r: %d dead letters replayed", self, n)
        return n

    def purge(self, *, dead: bool = True, ready: bool = False) -> dict[str, int]:
        """Drop the dead letters (``dead``) and every waiting message (``ready``: ready and
        delayed; running ones finish) of every queue; return the counts dropped."""
        self._check_open()
        calls = [(q, self._call(q, "purge", dead, ready)) for q in self.queue_indices if q not in self._lost]
        counts = {"dead": 0, "ready": 0}
        for q, pending in calls:
            n_dead, n_ready = self._answer(q, pending)
            counts["dead"] += n_dead
            counts["ready"] += n_ready
        return counts

    def _ids_by_queue(self, ids: Iterable[int] | None) -> dict[int, list[int] | None]:
        """``{queue: seqs}`` of task ids (``{queue: None}`` for every queue when ids is None)."""
        if ids is None:
            return {q: None for q in self.queue_indices if q not in self._lost}
        out: dict[int, list[int] | None] = {}
        for task_id in ids:
            check_number("task id", task_id, integer=True, at_least=0)
            q, seq = split_id(task_id)
            if q >= len(self.queues) or q in self._removed:
                raise ConfigurationError(f"task id {task_id} names queue {q}, which {self!r} does not have")
            out.setdefault(q, []).append(seq)  # type: ignore[union-attr]
        return out

    # -- the same from an event loop (an asynchronous Client, a notebook cell, a service) -------

    async def map_async(self, func: Callable[..., Any], iterable: Iterable[Any], **kwargs: Any) -> list[Any]:
        """:meth:`map`, awaited: it runs on a thread, so the event loop (and an asynchronous
        Client's calls) go on meanwhile."""
        items = list(iterable)
        return await asyncio.to_thread(self.map, func, items, **kwargs)

    async def batch_submit_async(self, tasks: Iterable[Sequence[Any]], **kwargs: Any) -> list[int]:
        """:meth:`batch_submit`, awaited (on a thread)."""
        tasks = list(tasks)
        return await asyncio.to_thread(self.batch_submit, tasks, **kwargs)

    async def put_many_async(self, items: Iterable[Any], **kwargs: Any) -> list[int]:
        """:meth:`put_many`, awaited (on a thread)."""
        items = list(items)
        return await asyncio.to_thread(self.put_many, items, **kwargs)

    async def result_async(self, task_id: int, timeout_s: float | None = None) -> Any:
        """:meth:`result`, awaited (on a thread)."""
        return await asyncio.to_thread(self.result, task_id, timeout_s)

    async def stats_async(self) -> list[QueueStats]:
        return await asyncio.to_thread(self.stats)

    async def close_async(self) -> None:
        """:meth:`close`, awaited (on a thread)."""
        if self._opening is None:
            await asyncio.to_thread(self.close)

    # -- inspection and lifetime ----------------------------------------------------------------

    def stats(self) -> list[QueueStats]:
        """A :class:`QueueStats` per queue, in queue order."""
        _not_in_client_loop(self.client)
        futures = [(i, self._call(i, "stats")) for i in self.queue_indices]
        return [self._answer_or_ask_again(i, f, "stats") for i, f in futures]

    def _answer_or_ask_again(self, q: int, pending: _Pending, method: str, *args: Any) -> Any:
        """``_answer``, asking the queue again where it moved to if it moved meanwhile (for
        calls that change nothing)."""
        try:
            return self._answer(q, pending)
        except QueueMovedError:
            return self._answer(q, self._call(q, method, *args))

    def get_queue_size(self) -> dict[int, int]:
        """Unsettled messages (ready, delayed or leased) per queue index."""
        return {s.index: s.pending for s in self.stats()}

    def close(self) -> None:
        """Close every queue (waiters are woken; later calls raise ``QueueClosedError``)."""
        if self._closed:
            return
        _not_in_client_loop(self.client)
        self._closed = True
        self._membership.remove_listener(self)
        if self._membership.scheduler_lost() is None:
            registry.unregister_pool(self)
        live = [(f"queue {i}", q) for i, q in enumerate(self.queues) if i not in self._lost and i not in self._removed]
        failed = call_all(live, "close", timeout_s=defaults.STOP_TIMEOUT_S)
        if failed:
            logger.warning("closing queues failed: %s", failed)
        logger.info("%r closed", self)

    def __enter__(self) -> QueuePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
