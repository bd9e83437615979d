"""Consumer actors: fetch batches from the queues, run them on their own threads, settle them.

Who runs what:

* ``start``/``stop``/``stats`` and the fetch loops are ``async`` and run on the worker's
  event loop; they only move blobs and never run user code.
* User code (``process_item``, task functions, ``setup``) runs on the consumer's own
  ``ThreadPoolExecutor`` of ``max_concurrency`` threads, a whole batch per submission.

:class:`ConsumerBase` is the actor and the user's extension point; it composes the parts
that do the work, each in its own module: the calls to the queues with their deadlines
(``calls``), where to fetch from (``fetching``), how much to fetch (``sizer``, pure), the
run slots (``running``), the settlements and lease extension (``settling``), and reading
payloads and task functions on the run threads (``payloads``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from daskqueue import defaults, metrics, producers
from daskqueue.consumer.batch import Batch, Outcome, dump_results
from daskqueue.consumer.calls import QueueCalls, worker_address
from daskqueue.consumer.counters import DURATION_BUCKETS_S, ConsumerStats, Counters
from daskqueue.consumer.fetching import FetchPolicy
from daskqueue.consumer.isolate import ProcessRunner
from daskqueue.consumer.limits import run_limited
from daskqueue.consumer.payloads import PayloadReader
from daskqueue.consumer.running import RunSlots, SlotConfig
from daskqueue.consumer.settling import Settler
from daskqueue.consumer.sizer import BatchSizer
from daskqueue.consumer.task_pools import TaskPools
from daskqueue.messages import Message, error_from_exception, make_id
from daskqueue.queue.handles import bind_local, queue_identity, released_actor
from daskqueue.queue.producer_results import segment_producers

__all__ = ["ConsumerBase", "ConsumerStats", "Batch", "Outcome", "DURATION_BUCKETS_S", "Isolation"]

logger = logging.getLogger("daskqueue")

Isolation = Literal["auto", "process", "thread"]


class ConsumerBase:
    """Base class of consumer actors. Subclass it and implement :meth:`process_item`.

    ``ConsumerPool`` creates the actors; a subclass that needs its own arguments takes them as
    keyword arguments after ``**kwargs`` and receives them through
    ``ConsumerPool(..., consumer_kwargs={...})``. Override :meth:`setup` to open resources
    once, on a run thread, before the first item.

    ``process_item`` returns the message's result (stored for ``ConsumerPool.results()``) or
    raises: the message is then retried with backoff and, after ``max_retries``,
    dead-lettered with the error, which ``ConsumerPool.failures()`` reports.

    ``pool_spec`` (given by ``ConsumerPool``) is the :class:`~daskqueue.producers.ProducerSpec`
    of the queue pool: what ``daskqueue.get_pool()`` inside ``process_item`` is made from.

    Actor methods: ``start``, ``stop``, ``close``, ``stats``; from the pool, ``set_queue``,
    ``set_queues`` and ``workers_lost``.
    """

    def __init__(
        self,
        index: int,
        queues: list[Any],
        *,
        home: int = 0,
        batch_size: int | None = None,
        max_concurrency: int = defaults.MAX_CONCURRENCY,
        prefetch_batches: int = defaults.PREFETCH_BATCHES,
        early_ack: bool = False,
        lease_timeout_s: float = defaults.LEASE_TIMEOUT_S,
        idle_poll_s: float = defaults.IDLE_POLL_S,
        target_batch_s: float = defaults.TARGET_BATCH_S,
        max_batch_size: int = defaults.MAX_BATCH_SIZE,
        isolation: Isolation = "auto",
        child_spec: bytes | None = None,
        reserved_slots: int = 0,
        reserved_priority: int = 1,
        pool_spec: Any = None,
    ) -> None:
        if not queues:
            raise ValueError("a consumer needs at least one queue")
        if isolation not in ("auto", "process", "thread"):
            raise ValueError(f"isolation must be 'auto', 'process' or 'thread', got {isolation!r}")
        self.index = index
        self.max_concurrency = max_concurrency
        #: Extra run slots that take only messages of priority >= ``reserved_priority``, one
        #: at a time: urgent work starts while every other slot runs long tasks.
        self.reserved_slots = reserved_slots
        self.reserved_priority = reserved_priority
        self.early_ack = early_ack
        # Read per item by the run threads: stop at the next item boundary. Never set with
        # early_ack, whose batches are acked before they run: an item not run would be lost.
        self._halt_items = False
        self._setup_lock = threading.Lock()
        self._setup_done = False
        # Function caches, bounded; a batch carries its own pickles (Batch.funcs) in case one
        # is evicted before it runs. The fetcher fills the pickled one (_func_bytes).
        self._payloads = PayloadReader(defaults.CONSUMER_FUNCTION_CACHE_ENTRIES)
        self._func_bytes = self._payloads.pickled
        self._isolation = isolation
        self._child_spec = child_spec  # builds this consumer's twin in a child process
        self._task_pools = TaskPools(pool_spec)  # what daskqueue.get_pool() in a task gives
        self._loop: asyncio.AbstractEventLoop | None = None  # the worker's, once started
        self._lifecycle: asyncio.Lock | None = None
        self._orphan_close: asyncio.Task[None] | None = None
        self._counters = Counters()
        self._calls = QueueCalls({i: q for i, q in enumerate(queues) if q is not None})
        self._sizer = BatchSizer(fixed=batch_size, initial=defaults.INITIAL_BATCH_SIZE,
                                 max_size=max_batch_size, target_batch_s=target_batch_s)
        settler = Settler(index, self._calls, self._counters, lease_timeout_s=lease_timeout_s, held=self._held)
        self._fetcher = FetchPolicy(index, self._calls, self._sizer, self._counters, settler,
                                    home=home % len(queues), idle_poll_s=idle_poll_s,
                                    reserved_priority=reserved_priority, func_bytes=self._func_bytes,
                                    stopping=self._stopping)
        self._slots = RunSlots(
            index, SlotConfig(max_concurrency, prefetch_batches, reserved_slots, early_ack), self._fetcher,
            settler, self._sizer, self._counters, run_on_thread=self._run_batch_safely,
            orphaned=functools.partial(released_actor, self),
            close_orphan=self._close_orphan,
        )

    def __repr__(self) -> str:
        state = "running" if self._slots.loop_task is not None else "stopped"
        return f"<{type(self).__name__} {self.index} ({state}): {self._counters.items_done:,} done>"

    def _stopping(self) -> bool:
        return self._slots.stop_requested

    def _held(self) -> list[tuple[int, int]]:
        return self._slots.held()

    # -- the user's extension points ------------------------------------------------------------

    def setup(self) -> None:
        """Called once per consumer, on a run thread, before its first item (other run
        threads wait for it). Override to open resources. If it raises, the items of that
        batch fail with its error (and are retried); it is tried again with the next batch."""

    def process_item(self, message: Message) -> Any:
        """Process one message and return its result. Runs on the consumer's thread pool."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_item(message)")

    # -- lifecycle (actor methods) --------------------------------------------------------------

    def _lifecycle_lock(self) -> asyncio.Lock:
        """Serialises start/stop/close: start awaits a child process's start, and a stop or a
        second start arriving meanwhile must wait for it, not act on a half-started consumer."""
        if self._lifecycle is None:
            self._lifecycle = asyncio.Lock()
        return self._lifecycle

    async def start(self) -> None:
        """Start fetching and running work. Idempotent."""
        async with self._lifecycle_lock():
            await self._start()

    async def _start(self) -> None:
        metrics.ensure_registered()  # this worker's /metrics shows its consumers
        if self._slots.loop_task is not None:
            return
        self._halt_items = False
        self._loop = asyncio.get_running_loop()
        has_local_queue = self._calls.bind()
        self._fetcher.owner = worker_address()
        if self._slots.process is None and self._wants_child(has_local_queue):
            await self._start_runner()
        if self._slots.process is not None:
            await self._slots.process.set_halt(False)
        self._slots.start()
        logger.debug("consumer %d started (%s)", self.index, "child process" if self._slots.process else "threads")

    def _wants_child(self, has_local_queue: bool) -> bool:
        """Whether to run batches in a child process: ``"auto"`` does when a queue lives in
        this worker process (user code that kills its process must not take it along)."""
        if self._child_spec is None or self._isolation == "thread":
            return False
        return self._isolation == "process" or has_local_queue

    async def _start_runner(self) -> None:
        runner = ProcessRunner(self._child_spec, self.index)  # type: ignore[arg-type]
        try:
            await runner.start()
        except Exception as e:  # threads still work: slower to lose, not wrong
            logger.warning("consumer %d: cannot run batches in a child process (%s); running them "
                           "on threads in the worker", self.index, e)
            await runner.close()
            return
        self._slots.process = runner

    async def stop(self) -> None:
        """Stop fetching; finish the item each thread is running, release the rest, settle.

        Returns once every fetched batch is settled: nothing fetched is lost, and messages that
        were fetched but not started go back to the front of their queue.
        """
        async with self._lifecycle_lock():
            await self._stop()

    async def _stop(self) -> None:
        if self._slots.loop_task is None:
            return
        # Order: stop fetching first (so no new batch arrives), then let the run threads stop
        # at the next item boundary, then await the settlements (RunSlots.join says why the
        # lease extender stops last).
        self._slots.stop_requested = True
        self._halt_items = not self.early_ack
        if self._slots.process is not None:
            await self._slots.process.set_halt(self._halt_items)
        # An idle fetch loop is in a long poll: have its queue answer it now.
        await self._calls.end_waits(self._fetcher.owner)
        await self._slots.join()
        await self._calls.close_late()
        self._calls.unbind()
        logger.debug("consumer %d stopped", self.index)

    async def close(self) -> None:
        """Stop, then shut the thread pool down."""
        async with self._lifecycle_lock():
            await self._close()

    async def _close(self) -> None:
        await self._stop()
        self._slots.shutdown()
        self.close_task_pools()
        if self._slots.process is not None:
            await self._slots.process.close()
            self._slots.process = None

    def _close_orphan(self) -> None:
        """The worker released this consumer (its pool's client is gone): stop and close it
        as ``close()`` would, on a task of its own (``close`` awaits the fetch loop), so its
        threads, child process and leases do not outlive the pool. Fetched work is settled;
        the rest stays in the queues for the next pool."""
        logger.warning("consumer %d: its pool's client is gone (the worker released the actor); "
                       "closing it", self.index)
        # Held here, not awaited: nobody is left to await it; it ends when close() does.
        self._orphan_close = asyncio.get_running_loop().create_task(self.close())

    async def stats(self) -> ConsumerStats:
        held = self._slots.inflight
        return self._counters.snapshot(self.index, running=self._slots.loop_task is not None,
                                       inflight_items=sum(b.count for b in held.values()),
                                       batch_size=self._sizer.size,
                                       inflight_queues=tuple(sorted({slot for slot, _ in held})))

    async def function_counts(self) -> dict[str, int]:
        """How many functions this consumer holds: pickled, unpickled, and in its child
        process (each bounded by ``defaults.CONSUMER_FUNCTION_CACHE_ENTRIES``)."""
        process = self._slots.process
        pickled, unpickled = self._payloads.counts()
        return {"pickled": pickled, "unpickled": unpickled,
                "child": 0 if process is None else process.child_functions}

    # -- the pool's messages (actor methods) ----------------------------------------------------

    async def workers_lost(self, addresses: list[str]) -> None:
        """The pool says these workers died: calls in flight to queues there are given up at
        once, and those queues are skipped until they are reported back."""
        self._calls.workers_lost(addresses)

    async def set_queue(self, queue_index: int, handle: Any) -> None:
        """Queue ``queue_index`` moved to ``handle`` (a durable queue reopened on another
        worker): later calls go there. Batches leased from the old one are refused there
        (their messages were recovered ready) and run again."""
        self._calls.move(queue_index, handle)
        self._fetcher.queue_back(queue_index)
        logger.info("consumer %d: queue %d moved to %s", self.index, queue_index,
                    getattr(self._calls.queues[queue_index], "_address", "this worker"))

    async def set_queues(self, refs: dict[int, Any], home: int) -> None:
        """The pool's queues changed (queues added, or one removed once drained): fetch
        from ``refs`` (queue index -> handle) from now on, with ``home`` first. Batches
        leased from a queue still in ``refs`` are settled there as before."""
        self._calls.replace(refs)
        self._fetcher.set_home(home)
        logger.info("consumer %d: queues are now %s, home %d", self.index, sorted(refs), home)

    # -- what metrics read (daskqueue.metrics) --------------------------------------------------

    def metrics_sample(self) -> metrics.ConsumerSample:
        """What ``/metrics`` and the status page show of this consumer (:mod:`daskqueue.metrics`)."""
        c = self._counters
        queues = self._calls.queues
        order = sorted(queues, key=lambda i: i != self._fetcher.home)
        return metrics.ConsumerSample(
            index=self.index, running=self._slots.loop_task is not None,
            slots=self.max_concurrency + self.reserved_slots, running_batches=c.busy_slots,
            done=c.items_done, failed=c.items_failed, batches=c.batches,
            duration_buckets=tuple(c.duration_buckets), duration_count=c.duration_count,
            duration_sum_s=c.duration_sum_s, queues=tuple(queue_identity(queues[i]) for i in order),
        )

    @property
    def abandoned(self) -> int:
        """Batches left to a thread that ignored its time limit."""
        return self._slots.abandoned

    # -- running a batch (consumer thread) ------------------------------------------------------

    def _run_batch_safely(
        self,
        batch: Batch,
        *,
        on_start: Callable[[int], None] | None = None,
        skip: dict[int, bytes] | None = None,
    ) -> tuple[Outcome, float]:
        """Run ``batch`` (after ``setup`` the first time); return its outcome and how long
        it ran. Never raises: a failing ``setup`` or ``run_batch`` fails every item of the
        batch with that error, so it is retried (or dead-lettered) like any failure.

        ``on_start(position)`` is called before each item and the items in ``skip`` fail
        with the error given there, unrun: a child process finding which item kills it
        (``daskqueue.consumer.isolate``) runs batches so; the fast path is ``run_batch``."""
        started = time.perf_counter()
        self._payloads.run_with(batch.funcs)  # what a function is read from if evicted (any run_batch)
        producers.running_in(self._pool_handles())
        try:
            if not self._setup_done:
                with self._setup_lock:  # several run threads may arrive here at once
                    if not self._setup_done:
                        self.setup()
                        self._setup_done = True
            if on_start is None and not skip:
                outcome = self.run_batch(batch)
            else:
                outcome = self._run_items(batch, on_start, skip or {})
        except Exception as e:
            logger.exception("consumer %d: a batch of %d failed as a whole", self.index, batch.count)
            error = error_from_exception(e)
            outcome = Outcome(batch.count, dict.fromkeys(range(batch.count), error), set(),
                              [None] * batch.count)
        finally:
            self._payloads.run_with(None)
            producers.running_in(None)
        outcome.producers = segment_producers(batch.segments)  # results are cut by producer
        return outcome, time.perf_counter() - started

    def _pool_handles(self) -> Any:
        """Where ``daskqueue.get_pool()`` gets its handles in this consumer's tasks (None if
        the consumer was made without its pool's spec)."""
        return self._task_pools.source(self._calls, self._loop)

    def close_task_pools(self) -> None:
        """Close what ``get_pool()`` in this consumer's tasks opened (a child's own Client)."""
        self._task_pools.close()

    def run_batch(self, batch: Batch) -> Outcome:
        """Run every message of ``batch`` through ``process_item``, stopping early on ``stop``."""
        return self._run_items(batch, None, {})

    def _run_items(self, batch: Batch, on_start: Callable[[int], None] | None,
                   skip: dict[int, bytes]) -> Outcome:
        results: list[Any] = []
        errors: dict[int, bytes] = {}
        fatal: set[int] = set()
        pos = 0
        for seg in batch.segments:
            producers.set_producer(seg.producer)
            values = self._payloads.values(seg)  # a packed segment's, unpickled once
            first_id = make_id(batch.queue_index, seg.first_seq)  # a segment's ids are consecutive
            for j, payload in enumerate(seg.payloads() if values is None else values):
                if self._halt_items:
                    return Outcome(pos, errors, fatal, results)
                if pos in skip:
                    errors[pos] = skip[pos]
                    results.append(None)
                    pos += 1
                    continue
                if on_start is not None:
                    on_start(pos)
                try:
                    message = Message(
                        first_id + j,
                        self._payloads.data(seg, payload, values is not None),
                        seg.type,
                        seg.priority,
                        seg.key,
                        seg.attempts,
                    )
                    if seg.time_limit_s:
                        results.append(run_limited(functools.partial(self.process_item, message), seg.time_limit_s))
                    else:
                        results.append(self.process_item(message))
                except Exception as e:
                    errors[pos] = error_from_exception(e)
                    results.append(None)
                pos += 1
        return Outcome(pos, errors, fatal, results)
