"""``ConsumerPool``: the client-side handle of a pool of consumer actors.

The pool follows the cluster (see :mod:`daskqueue.membership`): a default pool keeps one
consumer on every worker as workers join and leave; a pool of a fixed size re-places a
consumer lost with its worker at once, on the least busy surviving worker. That work runs
on the membership thread; the user's thread only reads a snapshot of the consumers, under
the pool's lock.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Iterable, Iterator

from distributed import Client

from daskqueue import atexit_close, defaults, registry
from daskqueue.consumer.base import ConsumerBase, ConsumerStats, Isolation
from daskqueue.consumer.general import GeneralConsumer
from daskqueue.consumer.members import Members
from daskqueue.errors import (
    ConfigurationError,
    RemoteTaskError,
)
from daskqueue.membership import forget, membership
from daskqueue.compat.consumer_pool import (
    ConsumerPool020,
    join_020,
    join_progress_020,
    nested_results,
    positional_020,
    read_options_020,
    results_nested,
)
from daskqueue.consumer.pool_async import ConsumerPoolAsync
from daskqueue.opening import OpensOnAwait
from daskqueue.outcome_stream import OutcomeStream
from daskqueue.queue.actors import NO_WORKERS_HINT, can_grow
from daskqueue.queue.pool import QueuePool, _not_in_client_loop
from daskqueue.validate import check_choice, check_number

__all__ = ["ConsumerPool"]

logger = logging.getLogger("daskqueue")


class ConsumerPool(ConsumerPool020, ConsumerPoolAsync, OpensOnAwait):
    """Consumer actors working on the queues of ``queue_pool``.

    Each consumer calls queue ``index mod n_queues`` its home; when the home queue is empty
    it takes work from the others, so every queue drains even with fewer consumers than
    queues.

    Parameters (keyword-only after ``queue_pool``):

    * ``ConsumerClass``: a :class:`ConsumerBase` subclass (default :class:`GeneralConsumer`).
    * ``n_consumers``: ``None`` (default) keeps one consumer on every worker, as workers join
      and leave; a number keeps that many, spread over the workers, re-placing one lost with
      its worker at once.
    * ``batch_size``: messages per fetch; ``None`` (default) adapts it to about
      ``target_batch_s`` (50 ms) of work per batch, up to ``max_batch_size``.
    * ``max_concurrency`` (default 1): threads per consumer running items; at most this many
      batches run and at most ``prefetch_batches`` (default 1) more wait, per consumer.
    * ``early_ack`` (default False): ack a batch as soon as it is fetched. Faster settlement,
      but a crash loses the batch and failures are not retried (at-most-once).
    * ``isolation``: where user code runs: ``"auto"`` (default) in a child process for a
      consumer whose worker also holds a queue (a task that kills its process then costs
      only itself), on threads otherwise; ``"process"`` always; ``"thread"`` never.
    * ``reserved_slots`` (default 0): extra run slots per consumer that take only messages
      of priority ``>= reserved_priority`` (default 1), one at a time, from any queue: an
      urgent task starts within milliseconds while every other slot runs long tasks.
    * ``consumer_kwargs``: extra keyword arguments for ``ConsumerClass``.

    Thread safety: the pool's methods may be called from one user thread while the pool
    follows the cluster on its own thread. (daskqueue 0.2.0's spellings: see
    :mod:`daskqueue.compat.consumer_pool`.)
    """

    @positional_020
    def __init__(
        self,
        client: Client,
        queue_pool: QueuePool,
        ConsumerClass: type[ConsumerBase] = GeneralConsumer,
        *,
        n_consumers: int | None = None,
        batch_size: int | None = None,
        max_concurrency: int = defaults.MAX_CONCURRENCY,
        early_ack: bool = False,
        prefetch_batches: int = defaults.PREFETCH_BATCHES,
        idle_poll_s: float = defaults.IDLE_POLL_S,
        target_batch_s: float = defaults.TARGET_BATCH_S,
        max_batch_size: int = defaults.MAX_BATCH_SIZE,
        isolation: Isolation = defaults.ISOLATION,  # type: ignore[assignment]
        reserved_slots: int = 0,
        reserved_priority: int = 1,
        consumer_kwargs: dict[str, Any] | None = None,
        retries: int | None = None,
    ) -> None:
        if not isinstance(queue_pool, QueuePool):
            raise ConfigurationError(f"queue_pool must be a QueuePool, got {type(queue_pool).__name__}")
        check_consumer_class(ConsumerClass)
        check_number("n_consumers", n_consumers, integer=True, at_least=1, none_ok=True)
        check_number("max_concurrency", max_concurrency, integer=True, at_least=1)
        max_concurrency = read_options_020(self, client, retries, max_concurrency)
        check_number("prefetch_batches", prefetch_batches, integer=True, at_least=0)
        check_number("reserved_slots", reserved_slots, integer=True, at_least=0)
        check_number("reserved_priority", reserved_priority, integer=True, at_least=-(2**31), at_most=2**31 - 1)
        check_number("max_batch_size", max_batch_size, integer=True, at_least=1)
        check_number("batch_size", batch_size, integer=True, at_least=1, none_ok=True)
        check_number("idle_poll_s", idle_poll_s, above=0)
        check_number("target_batch_s", target_batch_s, above=0)
        check_choice("isolation", isolation, ("auto", "process", "thread"))
        self.client = client
        self.queue_pool = queue_pool
        self.ConsumerClass = ConsumerClass
        self.per_worker = n_consumers is None
        self.early_ack = early_ack
        self.isolation = isolation
        self._options = dict(
            batch_size=batch_size, max_concurrency=max_concurrency, prefetch_batches=prefetch_batches,
            early_ack=early_ack, lease_timeout_s=queue_pool.lease_timeout_s, idle_poll_s=idle_poll_s,
            target_batch_s=target_batch_s, max_batch_size=max_batch_size, reserved_slots=reserved_slots,
            reserved_priority=reserved_priority, **(consumer_kwargs or {}),
        )
        self.members = Members(client, queue_pool, ConsumerClass, self._options, isolation=isolation,
                               per_worker=self.per_worker)
        self.id = uuid.uuid4().hex  # how the queues of a typed pool tell our slots apart
        self._open_now_or_on_await(client, lambda: self._open(n_consumers))

    def _open(self, n_consumers: int | None) -> None:
        # What daskqueue.get_pool() inside this pool's tasks is made from (daskqueue.producers).
        self._options.setdefault("pool_spec", self.queue_pool.producer_spec())
        self._membership = membership(self.client, owner=self)
        view = self._membership.view
        try:
            self.members.members = self._start_members(n_consumers, view)
        except BaseException:
            forget(self)
            raise
        # A worker that joined or left while the consumers started is told now, as a change.
        self._membership.add_listener(self, since=view)
        self.queue_pool.register_consumer_pool(self)
        registry.register_consumers(self)
        atexit_close.track(self)

    def _start_members(self, n_consumers: int | None, view: Any) -> list[Any]:
        """Start the consumers: ``n_consumers`` spread over the workers of ``view`` (a
        :class:`~daskqueue.membership.View`), or one on each."""
        workers = sorted(view.workers - view.retiring)
        self.members.target = n_consumers
        if not workers:  # they start on the workers that join (Members.on_membership)
            if not can_grow(self.client):
                raise ConfigurationError(NO_WORKERS_HINT)
            return []
        count = len(workers) if n_consumers is None else n_consumers
        strict = self.per_worker
        places = [workers[i % len(workers)] for i in range(count)]
        spawned = [(w, strict, *self.members.spawn(w, strict=strict)) for w in places]
        started = self.members.await_members(spawned)  # (releases them all if it raises)
        dead = self.queue_pool.lost_addresses()
        if dead and started:  # as Members.add tells those it adds: no poll waits on a queue known lost
            # (start() only tells of the workers the scheduler no longer has: one restarted
            # on the address it died with is there again, without the queue it held)
            self.members.tell(started, "workers_lost", dead)
        return started

    # -- consumers: creation, placement -------------------------------------------------------

    @property
    def n_consumers(self) -> int:
        return len(self.members.members)

    @property
    def consumers(self) -> list[Any]:
        """The consumer actors' handles (a snapshot: the pool changes as workers come and go)."""
        with self.members.lock:
            return [m.handle for m in self.members.members]

    # -- following the cluster (membership thread) --------------------------------------------

    def on_membership(self, joined: set[str], left: set[str], retiring: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Workers joined, left or are retiring: see :meth:`Members.on_membership`."""
        if self.members.closed:
            return
        self.members.on_membership(joined, left, retiring, self._membership)
        if self.running:
            self._tell_slots()
        if joined or left or retiring:
            registry.register_consumers(self)

    def on_workers_retiring(self, retiring: set[str]) -> list[Any]:
        """Called by the queue pool before its queues on ``retiring`` workers move: the
        consumers there settle and go first (see :meth:`Members.let_go`)."""
        return self.members.let_go(retiring)

    def on_queues_changed(self) -> None:
        """Called by the queue pool when it added or removed queues."""
        self.members.queues_changed()

    def on_queue_moved(self, queue_index: int, handle: Any) -> None:
        """Called by the queue pool when a queue moved to ``handle``."""
        self.members.queue_moved(queue_index, handle)

    # -- representation -----------------------------------------------------------------------

    def __repr__(self) -> str:
        state = "started" if self.members.started else "stopped"
        size = "one per worker" if self.per_worker else "fixed"
        return f"<ConsumerPool: {self.n_consumers} x {self.ConsumerClass.__name__} ({size}, {state})>"

    def _repr_html_(self) -> str:
        """Live counts per consumer for Jupyter, within 2 s (never hangs on a lost worker)."""
        from daskqueue import status

        return status.consumer_pool_html(self)

    # -- lifetime -----------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start every consumer (idempotent). Consumers that join later start on their own.
        (``timeout`` is daskqueue 0.2.0's; an idle consumer long-polls for ``idle_poll_s``.)"""
        _not_in_client_loop(self.client)
        self._start_timeout_020(timeout)
        self.members.started = True
        failed = self.members.call_all("start")
        if failed:
            logger.warning("starting consumers failed: %s", failed)
        self._tell_slots()

    def _tell_slots(self) -> None:
        """A typed queue pool shares its running slots out by type: tell it ours (none when
        stopped)."""
        slots = len(self.members.live()) * self._options["max_concurrency"] if self.running else 0
        self.queue_pool.set_slots(self.id, slots)

    def cancel(self) -> None:
        """Stop every consumer: running items finish, fetched-but-unstarted ones are released
        back to their queues, every fetched batch is settled. ``start()`` resumes. Returns
        within ``STOP_TIMEOUT_S`` (25 s) even if workers died; a consumer whose worker the
        scheduler no longer has is not waited for, and the others are told of the loss
        (:meth:`Members.ask_all`), though the pool may not have heard of it yet."""
        _not_in_client_loop(self.client)
        self.members.started = False
        self._tell_slots()
        failed = self.members.call_all("stop")
        if failed:
            logger.warning("stopping consumers failed: %s", failed)

    @join_020
    def join(self, *, timeout: float | None = None, timestep: float | None = None,
             print_timestep: float | None = None, progress: bool | None = None) -> None:
        """Wait until every message in the pool's queues is settled (acked or dead-lettered)
        and no consumer holds work; fetch results on the way.

        Raises :class:`JoinTimeoutError` with the counts after ``timeout`` seconds,
        :class:`NoConsumersError` if work is pending and no consumer pool of the queue pool
        is started, and
        :class:`QueueLostError` once a transient queue's worker is known dead.
        ``timeout`` is keyword-only: a positional ``join(0.1)`` is daskqueue 0.2.0's polling
        interval, as are ``timestep``, ``print_timestep`` and ``progress`` (with ``progress``,
        the counts are logged every ``print_timestep`` seconds); see
        :func:`~daskqueue.compat.consumer_pool.join_020`.
        """
        _not_in_client_loop(self.client)
        on_pass = join_progress_020(self, timestep, print_timestep, progress)
        self.queue_pool.outcomes.join(self._inflight, timeout, on_pass)

    def _inflight(self) -> int:
        """Items the live consumers hold (fetched, running or settling)."""
        return sum(s.inflight_items for s in self.stats())

    def settled_all(self) -> bool:
        """Whether every message of the queue pool is settled and no consumer holds work
        (what ``join`` waits for); raises :class:`NoConsumersError` as ``join`` does."""
        return self.queue_pool.outcomes.settled_all(self._inflight, None, None)

    def as_completed(self, ids: Iterable[int] | None = None, *,
                     timeout: float | None = None) -> Iterator[tuple[int, Any]]:
        """Yield ``(task_id, outcome)`` as outcomes arrive, and forget each once yielded:
        ``outcome`` is the task's return value, or a :class:`RemoteTaskError` if it was
        dead-lettered. With ``ids``, yields exactly those tasks' outcomes, then stops;
        without, every outcome that arrives until the pool is idle (what ``join`` waits
        for), then stops. Outcomes taken here are not in ``results()`` / ``failures()``.

        Client memory stays flat however many tasks stream through (one poll's outcomes at
        a time): the call to use for millions of tasks. Raises what ``join`` raises
        (:class:`JoinTimeoutError` after ``timeout`` seconds). Returns an iterator that, like
        a generator, has ``close()`` (stop early; see :class:`~daskqueue.outcome_stream.OutcomeStream`).
        """
        return OutcomeStream(self.outcome_batches(ids, timeout))

    def outcome_batches(self, ids: Iterable[int] | None, timeout: float | None) -> Iterator[list[tuple[int, Any]]]:
        """The outcomes of ``as_completed``, a poll's worth at a time."""
        return self.queue_pool.outcomes.batches(self._inflight, ids, timeout)

    def close(self) -> None:
        """Stop every consumer and end its threads and child process, and release every
        consumer actor. Returns within ``STOP_TIMEOUT_S`` (25 s) even if workers died; a
        consumer whose worker the scheduler no longer has is not called (nor waited for), and
        the others are told of the loss first, as :meth:`cancel` does. Idempotent."""
        _not_in_client_loop(self.client)
        if self.members.closed:
            return
        self.members.closed = True
        self._membership.remove_listener(self)
        lost = self._membership.scheduler_lost()
        if lost is None:
            registry.unregister_consumers(self)
            failed = self.members.close_all()  # and releases their futures
            if failed:
                logger.warning("closing consumers failed: %s", failed)
        else:  # no call can reach them: they close themselves once released (orphan check)
            logger.info("closing %r with the scheduler lost (%s): its consumers are not told", self, lost)
        self.members.started = False
        if not self.queue_pool.closed:
            self._tell_slots()
        forget(self)

    @property
    def replaced(self) -> int:
        """Consumers re-placed after their worker left or retired (fixed-size pools)."""
        return self.members.replaced

    @property
    def _closed(self) -> bool:  # the spelling tests read
        return self.members.closed

    @property
    def running(self) -> bool:
        """Whether the pool is started and not closed (what ``QueuePool.map`` asks)."""
        return self.members.started and not self.members.closed

    # -- outcomes -----------------------------------------------------------------------------

    def results(self, *, clear: bool = False, by_consumer: bool | None = None) -> dict[Any, Any]:
        """``{task_id: return value}`` of every acked task so far (``map`` keeps its own);
        :meth:`QueuePool.results` (``clear=True`` forgets those returned).

        ``by_consumer=True`` nests them by the consumer that ran them, as daskqueue 0.2.0's
        ``results()`` did: ``{"GeneralConsumer-0": {task_id: value}, ...}`` (a task whose
        consumer is not known, e.g. one that moved queue, is under ``"unknown"``). The
        default (``None``) nests only for a pool made with 0.2.0's spellings, warning."""
        if by_consumer is None:
            by_consumer = results_nested(self)
        if not by_consumer:
            return self.queue_pool.results(clear=clear)
        return nested_results(self, clear)

    @property
    def max_concurrency(self) -> int:
        """Threads each consumer runs tasks on."""
        return int(self._options["max_concurrency"])

    def result(self, task_id: int, timeout: float | None = None) -> Any:
        """The return value of one task, waiting for it (long-polling its queue).

        Raises its :class:`RemoteTaskError` if it was dead-lettered, and
        :class:`JoinTimeoutError` if it is not settled within ``timeout`` seconds;
        :meth:`QueuePool.result`.
        """
        return self.queue_pool.result(task_id, timeout_s=timeout)

    def failures(self, *, clear: bool = False) -> dict[int, RemoteTaskError]:
        """``{task_id: RemoteTaskError}`` of every dead-lettered task so far;
        :meth:`QueuePool.failures`."""
        return self.queue_pool.failures(clear=clear)

    def stats(self) -> list[ConsumerStats]:
        """A :class:`ConsumerStats` per live consumer, in the order of :attr:`consumers`.
        A consumer whose worker died is left out (the pool replaces it on its own), as soon
        as the scheduler says it is gone. Starts nothing; bounded by ``CONTROL_CALL_TIMEOUT_S``
        for all the calls together."""
        _not_in_client_loop(self.client)
        live = self.members.live()
        answers, failed = self.members.ask_all(live, "stats", timeout_s=defaults.CONTROL_CALL_TIMEOUT_S,
                                               look_first=False)
        if failed:
            logger.warning("consumers left out of stats: %s", failed)
        return [answers[m.index] for m in live if m.index in answers]


def check_consumer_class(ConsumerClass: Any) -> None:
    """Raise :class:`ConfigurationError` unless ``ConsumerClass`` is a :class:`ConsumerBase`
    subclass that processes items (as daskqueue 0.2.0 refused an abstract one at creation)."""
    if not (isinstance(ConsumerClass, type) and issubclass(ConsumerClass, ConsumerBase)):
        raise ConfigurationError(f"ConsumerClass must subclass ConsumerBase, got {ConsumerClass!r}")
    abstract = getattr(ConsumerClass, "__abstractmethods__", None)
    if abstract or (ConsumerClass.process_item is ConsumerBase.process_item
                    and ConsumerClass.run_batch is ConsumerBase.run_batch):
        raise ConfigurationError(f"{ConsumerClass.__name__} must implement process_item(self, message): "
                                 "it has none, so every item would fail")
