"""Consumer actors: fetch batches from the queues, run them on their own threads, settle them.

Who runs what:

* ``start``/``stop``/``stats`` and the fetch loop are ``async`` and run on the worker's event
  loop; they only move blobs and never run user code.
* User code (``process_item``, task functions, ``setup``) runs on the consumer's own
  ``ThreadPoolExecutor`` of ``max_concurrency`` threads, a whole batch per submission.

A queue actor on the consumer's own worker is called directly, as a coroutine on the same
event loop, instead of through Dask's actor RPC (which would serialize the call and send it
through a socket to the process it is already in).

Backpressure: at most ``max_concurrency + prefetch_batches`` fetched batches exist at once;
the loop fetches the next only when one of those slots frees up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Literal

from daskqueue import defaults, metrics
from daskqueue.consumer.limits import run_limited, watchdog
from daskqueue.errors import LeaseExpiredError, QueueHandedOffError, QueueLostError
from daskqueue.messages import Kind, Message, Task, error_from_exception, make_id
from daskqueue.queue.handles import ORPHAN_CHECK_S, released_actor, worker_handle
from daskqueue.serialize import Segment, decode_delivery, dumps, encode_settle, loads

__all__ = ["ConsumerBase", "ConsumerStats", "Batch", "Outcome"]

logger = logging.getLogger("daskqueue")

#: How long a consumer leaves a queue alone after a call to it failed.
QUEUE_RETRY_S = 5.0

#: The deadline of a call to a queue on another worker, beyond the call's own wait. A call
#: to a queue whose worker died can stay unanswered for good inside Dask; the consumer
#: abandons it at once when the pool says that worker left (``workers_lost``), and after
#: this deadline otherwise.
REMOTE_CALL_TIMEOUT_S = 20.0


Isolation = Literal["auto", "process", "thread"]


def _bind_local(handle: Any) -> Any:
    """The queue actor object behind ``handle`` if it lives in this worker process (its
    ``async`` methods are then awaited directly), else ``handle`` itself."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not on a worker: tests driving a consumer by hand
        return handle
    key, address = getattr(handle, "key", None), getattr(handle, "_address", None)
    if key is None or address != worker.address:
        return handle
    return worker.state.actors.get(key, handle)


@dataclass(slots=True, eq=False)
class Batch:
    """A fetched delivery: the lease, the queue it came from, and its segments."""

    queue_slot: int  # the index of the queue it was leased from
    queue_index: int
    lease_id: int
    segments: list[Segment]
    count: int
    reserved: bool = False  # fetched by a reserved slot (urgent work): not a batch-size sample


@dataclass(slots=True, eq=False)
class Outcome:
    """What running a batch gave: ``done`` messages ran; failures by position; results
    (as values, or already pickled in ``results_blob`` when a child process ran them)."""

    done: int
    errors: dict[int, bytes]
    fatal: set[int]
    results: list[Any]
    results_blob: bytes | None = None


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A snapshot of one consumer."""

    index: int
    running: bool
    batches: int
    items_done: int
    items_failed: int
    inflight_items: int
    batch_size: int
    refused_settlements: int
    fetch_calls: int
    busy_slots: int = 0  # batches running now (not counting those fetched ahead)
    #: Task durations: the count of tasks whose run took at most each of
    #: ``DURATION_BUCKETS_S`` (cumulative, as Prometheus histograms are), their total, and
    #: the sum of their durations. A batch's tasks count its mean time per task each.
    duration_buckets: tuple[int, ...] = ()
    duration_count: int = 0
    duration_sum_s: float = 0.0


#: Upper bounds (seconds) of the task-duration histogram of :class:`ConsumerStats`.
DURATION_BUCKETS_S = defaults.DURATION_BUCKETS_S


class ConsumerBase:
    """Base class of consumer actors. Subclass it and implement :meth:`process_item`.

    ``ConsumerPool`` creates the actors; a subclass that needs its own arguments takes them as
    keyword arguments after ``**kwargs`` and receives them through
    ``ConsumerPool(..., consumer_kwargs={...})``. Override :meth:`setup` to open resources
    once, on a run thread, before the first item.

    ``process_item`` returns the message's result (stored for ``ConsumerPool.results()``) or
    raises: the message is then retried with backoff and, after ``max_retries``,
    dead-lettered with the error, which ``ConsumerPool.failures()`` reports.
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
    ) -> None:
        if not queues:
            raise ValueError("a consumer needs at least one queue")
        if isolation not in ("auto", "process", "thread"):
            raise ValueError(f"isolation must be 'auto', 'process' or 'thread', got {isolation!r}")
        self.index = index
        # By queue index (a pool's queues may come and go); asked home first, then the
        # others in turn: an idle consumer takes their work.
        self._queues: dict[int, Any] = {i: worker_handle(q) for i, q in enumerate(queues) if q is not None}
        self._home = home % len(queues)
        self._order: list[int] = []
        self._set_order()
        self._fixed_batch = batch_size
        self._batch_size = batch_size or defaults.INITIAL_BATCH_SIZE
        self._max_batch = max_batch_size if batch_size is None else batch_size
        self._target_batch_s = target_batch_s
        self.max_concurrency = max_concurrency
        #: Extra run slots that take only messages of priority >= ``reserved_priority``, one
        #: at a time: urgent work starts while every other slot runs long tasks.
        self.reserved_slots = reserved_slots
        self.reserved_priority = reserved_priority
        self._reserved_task: asyncio.Task[None] | None = None
        self._hints: list[tuple[int, int]] = []  # (queue, announcement) the home queue last said have work
        # Announcements found stale (the queue was empty after all), ignored until then.
        self._stale: dict[tuple[int, int], float] = {}
        self._hints_reserved: list[tuple[int, int]] = []  # the same, for the reserved slots
        self._stale_reserved: dict[tuple[int, int], float] = {}
        self._reserved_executor: ThreadPoolExecutor | None = None
        self._reserved_idle = False
        self._prefetch = prefetch_batches
        self.early_ack = early_ack
        self._lease_timeout_s = lease_timeout_s
        self._idle_poll_s = idle_poll_s
        self._executor: ThreadPoolExecutor | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._extender: asyncio.Task[None] | None = None
        self._finishing: set[asyncio.Task[None]] = set()
        self._inflight: dict[tuple[int, int], Batch] = {}  # (slot, lease_id) -> batch
        self._stop_requested = False  # stops the fetch loop
        # Read per item by the run threads: stop at the next item boundary. Never set with
        # early_ack, whose batches are acked before they run: an item not run would be lost.
        self._halt_items = False
        self._setup_lock = threading.Lock()
        self._queue_down_until: dict[int, float] = {}  # queue index -> monotonic time to retry
        self._func_bytes: dict[bytes, bytes] = {}
        self._funcs: dict[bytes, Any] = {}
        self._setup_done = False
        self._batches = self._items_done = self._items_failed = 0
        self._refused = self._fetch_calls = 0
        self._running_batches = 0
        self._batch_threads: dict[int, int] = {}  # lease id -> the thread running it
        self.abandoned = 0  # batches left to a thread that ignored its time limit
        self._duration_buckets = [0] * len(DURATION_BUCKETS_S)
        self._duration_count = 0
        self._duration_sum_s = 0.0
        self._per_item_s: float | None = None
        # Per message type, when batches hold one type (a fair or capped pool): the same
        # adaptive size, sent with each fetch once two types were seen, so that a queue
        # sizes a batch of short tasks for short tasks even beside a backlog of long ones.
        self._type_sizes: dict[str | None, tuple[int, float]] = {}
        self._home_idle = False
        self._isolation = isolation
        self._child_spec = child_spec  # builds this consumer's twin in a child process
        self._runner: Any = None  # a ProcessRunner while batches run in a child process
        self._address: str | None = None  # this consumer's worker: the owner of its leases
        self._dead_addresses: set[str] = set()
        self._lost_event: asyncio.Event | None = None
        self._lifecycle: asyncio.Lock | None = None
        self._orphan_close: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        state = "running" if self._loop_task is not None else "stopped"
        return f"<{type(self).__name__} {self.index} ({state}): {self._items_done:,} done>"

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
        if self._loop_task is not None:
            return
        self._stop_requested = self._halt_items = False
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                self.max_concurrency, thread_name_prefix=f"daskqueue-consumer-{self.index}"
            )
        if self._reserved_executor is None and self.reserved_slots:
            # Threads of their own: a batch fetched ahead waits for a general thread and can
            # never take a reserved one.
            self._reserved_executor = ThreadPoolExecutor(
                self.reserved_slots, thread_name_prefix=f"daskqueue-consumer-{self.index}-reserved"
            )
        handles = self._queues
        self._queues = {i: _bind_local(q) for i, q in handles.items()}
        self._address = _worker_address()
        self._lost_event = asyncio.Event()
        if self._runner is None and self._wants_child(handles):
            await self._start_runner()
        if self._runner is not None:
            await self._runner.set_halt(False)
        loop = asyncio.get_running_loop()
        self._loop_task = loop.create_task(self._fetch_loop())
        if self.reserved_slots:
            self._reserved_task = loop.create_task(self._fetch_loop(reserved=True))
        if not self.early_ack:
            self._extender = loop.create_task(self._extend_forever())
        logger.debug("consumer %d started (%s)", self.index, "child process" if self._runner else "threads")

    def _wants_child(self, handles: list[Any]) -> bool:
        """Whether to run batches in a child process: ``"auto"`` does when a queue lives in
        this worker process (user code that kills its process must not take it along)."""
        if self._child_spec is None or self._isolation == "thread":
            return False
        return self._isolation == "process" or any(self._queues[i] is not h for i, h in handles.items())

    async def _start_runner(self) -> None:
        from daskqueue.consumer.isolate import ProcessRunner

        runner = ProcessRunner(self._child_spec, self.index)  # type: ignore[arg-type]
        try:
            await runner.start()
        except Exception as e:  # threads still work: slower to lose, not wrong
            logger.warning("consumer %d: cannot run batches in a child process (%s); running them "
                           "on threads in the worker", self.index, e)
            await runner.close()
            return
        self._runner = runner

    async def stop(self) -> None:
        """Stop fetching; finish the item each thread is running, release the rest, settle.

        Returns once every fetched batch is settled: nothing fetched is lost, and messages that
        were fetched but not started go back to the front of their queue.
        """
        async with self._lifecycle_lock():
            await self._stop()

    async def _stop(self) -> None:
        if self._loop_task is None:
            return
        # Order: stop fetching first (so no new batch arrives), then let the run threads stop
        # at the next item boundary, then await the settlements, then stop extending leases
        # (an unsettled lease must stay alive until its settlement has been answered).
        self._stop_requested = True
        self._halt_items = not self.early_ack
        if self._runner is not None:
            await self._runner.set_halt(self._halt_items)
        await self._loop_task
        self._loop_task = None
        if self._reserved_task is not None:
            await self._reserved_task
            self._reserved_task = None
        while self._finishing:
            await asyncio.gather(*list(self._finishing))
        if self._extender is not None:
            self._extender.cancel()
            try:
                await self._extender
            except asyncio.CancelledError:
                pass
            except Exception:  # it already logged; stopping must not fail because of it
                logger.exception("consumer %d: the lease extender had failed", self.index)
            self._extender = None
        logger.debug("consumer %d stopped", self.index)

    async def close(self) -> None:
        """Stop, then shut the thread pool down."""
        async with self._lifecycle_lock():
            await self._close()

    async def _close(self) -> None:
        await self._stop()
        for executor in (self._executor, self._reserved_executor):
            if executor is not None:
                executor.shutdown(wait=False)
        self._executor = self._reserved_executor = None
        if self._runner is not None:
            await self._runner.close()
            self._runner = None

    async def stats(self) -> ConsumerStats:
        return ConsumerStats(
            index=self.index,
            running=self._loop_task is not None,
            batches=self._batches,
            items_done=self._items_done,
            items_failed=self._items_failed,
            inflight_items=sum(b.count for b in self._inflight.values()),
            batch_size=self._batch_size,
            refused_settlements=self._refused,
            fetch_calls=self._fetch_calls,
            busy_slots=self._running_batches,
            duration_buckets=tuple(self._duration_buckets),
            duration_count=self._duration_count,
            duration_sum_s=self._duration_sum_s,
        )

    # -- calls to the queues: local ones awaited directly, remote ones with a deadline ----------

    async def _call(self, slot: int, method: str, *args: Any, wait_s: float = 0.0) -> Any:
        """``method(*args)`` of the queue in ``slot``. A remote call is given up (raising
        :class:`QueueLostError`) as soon as its worker is reported lost, or after
        ``wait_s + REMOTE_CALL_TIMEOUT_S`` (raising ``TimeoutError``)."""
        queue = self._queues[slot]
        address = getattr(queue, "_address", None)
        if address is None:  # the queue object itself, in this process
            return await getattr(queue, method)(*args)
        if address in self._dead_addresses:
            raise QueueLostError(slot, address, "unknown")
        call = asyncio.ensure_future(getattr(queue, method)(*args))
        lost = asyncio.ensure_future(self._until_lost(address))
        try:
            done, _ = await asyncio.wait({call, lost}, timeout=wait_s + REMOTE_CALL_TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if call in done:
            return call.result()
        call.cancel()
        if lost in done:
            raise QueueLostError(slot, address, "unknown")
        raise TimeoutError(f"queue slot {slot} at {address} did not answer {method} in time")

    async def _call_moving(self, slot: int, method: str, *args: Any) -> Any:
        """``_call``, made again where the queue moved if it handed itself off meanwhile
        (its worker retires): the lease went with it, so the settlement still counts."""
        for _ in range(2):
            queue = self._queues[slot]
            try:
                return await self._call(slot, method, *args)
            except QueueHandedOffError:
                deadline = time.monotonic() + defaults.MOVE_WAIT_S
                while self._queues[slot] is queue and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)  # until the pool says where it moved (set_queue)
        return await self._call(slot, method, *args)

    async def _until_lost(self, address: str) -> None:
        while address not in self._dead_addresses:
            assert self._lost_event is not None
            await self._lost_event.wait()

    async def workers_lost(self, addresses: list[str]) -> None:
        """The pool says these workers died: calls in flight to queues there are given up at
        once, and those queues are skipped until they are reported back."""
        self._dead_addresses.update(addresses)
        if self._lost_event is not None:
            self._lost_event.set()
            self._lost_event = asyncio.Event()

    async def set_queue(self, queue_index: int, handle: Any) -> None:
        """Queue ``queue_index`` moved to ``handle`` (a durable queue reopened on another
        worker): later calls go there. Batches leased from the old one are refused there
        (their messages were recovered ready) and run again."""
        handle = worker_handle(handle)
        self._queues[queue_index] = _bind_local(handle) if self._loop_task is not None else handle
        self._queue_down_until.pop(queue_index, None)
        # A worker restarted on a fixed port comes back under the address it died with.
        self._dead_addresses.discard(getattr(handle, "_address", None))  # type: ignore[arg-type]
        logger.info("consumer %d: queue %d moved to %s", self.index, queue_index,
                    getattr(handle, "_address", "this worker"))

    def _set_order(self) -> None:
        """The queues in the order a fetch asks them: home first, then the next indices."""
        if not self._queues:  # a child process's twin, which calls no queue
            self._order = []
            return
        if self._home not in self._queues:
            raise ValueError(f"home queue {self._home} is not one of the queues {sorted(self._queues)}")
        idx = sorted(self._queues)
        k = idx.index(self._home)
        self._order = idx[k:] + idx[:k]

    async def set_queues(self, refs: dict[int, Any], home: int) -> None:
        """The pool's queues changed (queues added, or one removed once drained): fetch
        from ``refs`` (queue index -> handle) from now on, with ``home`` first. Batches
        leased from a queue still in ``refs`` are settled there as before."""
        bound = self._loop_task is not None
        queues = {i: worker_handle(ref) for i, ref in refs.items()}
        self._queues = {i: _bind_local(h) for i, h in queues.items()} if bound else queues
        self._home = home
        self._set_order()
        self._hints, self._hints_reserved = [], []
        for i in [i for i in self._queue_down_until if i not in queues]:
            del self._queue_down_until[i]
        logger.info("consumer %d: queues are now %s, home %d", self.index, sorted(queues), home)

    # -- the fetch loop (event loop) ------------------------------------------------------------

    async def _fetch_loop(self, reserved: bool = False) -> None:
        """Fetch and start batches while there is a free slot: the general slots (and the
        prefetch) with ``_fetch``; with ``reserved``, the reserved slots with
        ``_fetch_urgent`` (only messages of priority >= ``reserved_priority``, one per batch,
        from any queue, home first). The general loop also closes an orphaned consumer."""
        slots = asyncio.Semaphore(self.reserved_slots if reserved else self.max_concurrency + self._prefetch)
        fetch = self._fetch_urgent if reserved else self._fetch
        loop = asyncio.get_running_loop()
        checked_at = time.monotonic()
        while not self._stop_requested:
            if not reserved and time.monotonic() - checked_at > ORPHAN_CHECK_S:
                checked_at = time.monotonic()
                if released_actor(self):
                    self._close_orphan()
                    return
            await slots.acquire()
            try:
                batch = None if self._stop_requested else await fetch()
            except Exception:
                slots.release()
                logger.exception("consumer %d: fetching failed; retrying in %g s", self.index, defaults.FETCH_RETRY_S)
                await asyncio.sleep(defaults.FETCH_RETRY_S)
                continue
            if batch is None:
                slots.release()
                continue
            self._inflight[(batch.queue_slot, batch.lease_id)] = batch
            task = loop.create_task(self._run_and_settle(batch, slots))
            self._finishing.add(task)
            task.add_done_callback(self._finishing.discard)

    async def _fetch_urgent(self) -> Batch | None:
        """A reserved slot's fetch: one message of priority >= ``reserved_priority``, from
        where the home queue last said urgent work is, else from a long poll of home (which
        answers at once with peers that announced urgent work)."""
        home = self._home
        if len(self._queues) > 1 and not self._is_down(home):
            return await self._fetch_hinted(1, None, min_priority=self.reserved_priority)
        first = 1 if self._reserved_idle else 0
        for slot in self._order[first:]:
            blob = await self._get_from(slot, 1, 0.0, self.reserved_priority)
            if blob is not None:
                self._reserved_idle = False
                return await self._decode(slot, blob, reserved=True)
            if self._stop_requested:
                return None
        if self._is_down(home):
            await asyncio.sleep(self._idle_poll_s)
            return None
        blob = await self._get_from(home, 1, self._idle_poll_s, self.reserved_priority)
        self._reserved_idle = blob is None
        return None if blob is None else await self._decode(home, blob, reserved=True)

    def _close_orphan(self) -> None:
        """The worker released this consumer (its pool's client is gone): stop and close it
        as ``close()`` would, on a task of its own (``close`` awaits this fetch loop), so its
        threads, child process and leases do not outlive the pool. Fetched work is settled;
        the rest stays in the queues for the next pool."""
        logger.warning("consumer %d: its pool's client is gone (the worker released the actor); "
                       "closing it", self.index)
        # Held here, not awaited: nobody is left to await it; it ends when close() does.
        self._orphan_close = asyncio.get_running_loop().create_task(self.close())

    async def _fetch(self) -> Batch | None:
        """One fetch: the queues the home queue last said have work, then a long poll of the
        home queue, which answers with a batch, or at once with where work is elsewhere
        (the queues tell each other when they have work): an idle consumer makes one call
        per ``idle_poll_s``, however many queues there are.

        A queue that fails (its worker died, it was closed) is skipped for
        ``QUEUE_RETRY_S``; the others are still served. With the home queue failing, the
        others are asked in turn.
        """
        n = self._batch_size
        sizes = {t: size for t, (size, _) in self._type_sizes.items()} if len(self._type_sizes) > 1 else None
        home = self._home
        if len(self._queues) > 1 and not self._is_down(home):
            return await self._fetch_hinted(n, sizes)
        # Right after a long poll of the home queue timed out, asking it again is wasted.
        first = 1 if self._home_idle else 0
        for slot in self._order[first:]:
            blob = await self._get_from(slot, n, 0.0, sizes=sizes)
            if blob is not None:
                self._home_idle = False
                return await self._decode(slot, blob)
            if self._stop_requested:
                return None
        if self._is_down(home):
            await asyncio.sleep(self._idle_poll_s)
            return None
        blob = await self._get_from(home, n, self._idle_poll_s, sizes=sizes)
        self._home_idle = blob is None
        if blob is None and self._fixed_batch is None:
            # Idle: the next work may be of another kind; learn its duration afresh.
            self._batch_size = defaults.INITIAL_BATCH_SIZE
            self._per_item_s = None
            self._type_sizes.clear()
        return None if blob is None else await self._decode(home, blob)

    async def _fetch_hinted(self, n: int, sizes: dict[str | None, int] | None,
                            min_priority: int | None = None) -> Batch | None:
        """The general slots' fetch (``min_priority`` None) or a reserved slot's: each keeps
        its own hints and stale announcements."""
        reserved = min_priority is not None
        hints_of, stale = ("_hints_reserved", self._stale_reserved) if reserved else ("_hints", self._stale)
        now = time.monotonic()
        hints = getattr(self, hints_of)
        setattr(self, hints_of, [])
        home = self._home
        for index, number in hints:
            slot = index
            if slot == home or slot not in self._queues:
                continue
            if self._is_down(slot):  # not until it is back: the home queue would say it again at once
                stale[(index, number)] = self._queue_down_until[slot]
                continue
            blob = await self._get_from(slot, n, 0.0, min_priority, sizes=sizes)
            if blob is not None:
                return await self._decode(slot, blob, reserved=reserved)
            # Drained by another consumer since: ignore this announcement (not the queue's
            # next one) for a poll interval, in case its "no work" never comes.
            stale[(index, number)] = now + self._idle_poll_s
            if self._stop_requested:
                return None
        for w in [w for w, until in stale.items() if until <= now]:
            del stale[w]
        answer = await self._get_from(home, n, self._idle_poll_s, min_priority, sizes=sizes, hints=True,
                                      ignore=list(stale))
        if isinstance(answer, list):
            setattr(self, hints_of, answer)
            return None
        if reserved:
            return None if answer is None else await self._decode(home, answer, reserved=True)
        if answer is None and self._fixed_batch is None:
            # Idle: the next work may be of another kind; learn its duration afresh.
            self._batch_size = defaults.INITIAL_BATCH_SIZE
            self._per_item_s = None
            self._type_sizes.clear()
        return None if answer is None else await self._decode(home, answer)

    def _is_down(self, slot: int) -> bool:
        until = self._queue_down_until.get(slot)
        return until is not None and time.monotonic() < until

    async def _get_from(self, slot: int, n: int, wait_s: float, min_priority: int | None = None,
                        sizes: dict[str | None, int] | None = None, hints: bool = False,
                        ignore: list[int] | None = None) -> Any:
        """``get_batch`` of one queue; ``None`` if it is empty, down or failing (with
        ``hints``, maybe the list of queues with work instead)."""
        if self._is_down(slot):
            return None
        self._fetch_calls += 1
        try:
            args: tuple[Any, ...] = (n, wait_s, self._address)
            if min_priority is not None or sizes is not None or hints:
                args += (min_priority, sizes)
            if hints:
                args += (True, ignore or None)
            blob = await self._call(slot, "get_batch", *args, wait_s=wait_s)
        except Exception as e:
            if slot not in self._queue_down_until:
                logger.warning(
                    "consumer %d: queue slot %d failed (%s: %s); skipping it for %g s",
                    self.index, slot, type(e).__name__, e, QUEUE_RETRY_S,
                )
            self._queue_down_until[slot] = time.monotonic() + QUEUE_RETRY_S
            return None
        if self._queue_down_until:
            self._queue_down_until.pop(slot, None)  # back: a new failure is logged again
        return blob

    async def _decode(self, slot: int, blob: bytes, *, reserved: bool = False) -> Batch:
        lease_id, queue_index, segments = decode_delivery(blob)
        missing = {s.digest for s in segments if s.digest is not None} - self._func_bytes.keys()
        if missing:
            self._func_bytes.update(await self._call(slot, "get_functions", list(missing)))
        return Batch(slot, queue_index, lease_id, segments, sum(s.count for s in segments), reserved)

    async def _run_and_settle(self, batch: Batch, slots: asyncio.Semaphore) -> None:
        try:
            if self.early_ack:
                await self._settle(batch, Outcome(batch.count, {}, set(), []), early=True)
            self._running_batches += 1
            try:
                outcome, run_s = await self._run(batch)
            finally:
                self._running_batches -= 1
            self._observe(outcome.done, run_s)
            if not batch.reserved:
                self._adapt(outcome.done, run_s)
                self._adapt_type(batch, outcome.done, run_s)
            if self.early_ack:
                await self._record(batch, outcome)
            else:
                await self._settle(batch, outcome, early=False)
        except _Abandoned:
            # Late ack: not settled, its lease expires and the queue redelivers it (an
            # attempt). Early ack: acked already, so its items fail here, with no result.
            if self.early_ack:
                from daskqueue.consumer.isolate import time_limit_error

                errors = {p: time_limit_error(batch, p) for p in range(batch.count)}
                try:
                    await self._record(batch, Outcome(batch.count, errors, set(), [None] * batch.count))
                except Exception:
                    logger.exception("consumer %d: recording the time-limit failures of lease %d failed",
                                     self.index, batch.lease_id)
        except Exception:
            logger.exception(
                "consumer %d: settling lease %d failed; its messages will be redelivered",
                self.index, batch.lease_id,
            )
        finally:
            del self._inflight[(batch.queue_slot, batch.lease_id)]
            slots.release()

    async def _run(self, batch: Batch) -> tuple[Outcome, float]:
        """Run ``batch`` on the thread pool, or in the child process when there is one."""
        if self._runner is None:
            loop = asyncio.get_running_loop()
            executor = self._reserved_executor if batch.reserved else self._executor
            running = loop.run_in_executor(executor, self._run_batch_safely, batch)
            if not any(seg.time_limit_s for seg in batch.segments):
                return await running
            return await self._run_watched(batch, running)
        done, errors, fatal, blob, run_s = await self._runner.run(batch, self._func_bytes)
        return Outcome(done, errors, fatal, [], blob), run_s

    async def _run_watched(self, batch: Batch, running: asyncio.Future[Any]) -> tuple[Outcome, float]:
        """Await a batch with time limits; if an item ignores its interruption for
        ``TIME_LIMIT_GRACE_S``, leave its thread behind: raise :class:`_Abandoned` (the batch
        is not settled and its lease no longer extended, so the queue redelivers it), and run
        later batches on fresh threads so that the slot is not lost."""
        while True:
            done, _ = await asyncio.wait({running}, timeout=min(1.0, defaults.TIME_LIMIT_GRACE_S / 5))
            if done:
                return running.result()
            thread = self._batch_threads.get(batch.lease_id)
            if thread is not None and watchdog.overdue_s(thread) > defaults.TIME_LIMIT_GRACE_S:
                break
        self.abandoned += 1
        logger.error("consumer %d: an item of lease %d ignored its time limit for %g s (a C call, or "
                     "it caught the exception); leaving its thread behind, its lease to expire",
                     self.index, batch.lease_id, defaults.TIME_LIMIT_GRACE_S)
        if batch.reserved:
            old, self._reserved_executor = self._reserved_executor, ThreadPoolExecutor(
                self.reserved_slots, thread_name_prefix=f"daskqueue-consumer-{self.index}-reserved")
        else:
            old, self._executor = self._executor, ThreadPoolExecutor(
                self.max_concurrency, thread_name_prefix=f"daskqueue-consumer-{self.index}")
        if old is not None:
            old.shutdown(wait=False)
        raise _Abandoned(batch.lease_id)

    async def _settle(self, batch: Batch, outcome: Outcome, *, early: bool) -> None:
        results = None if early else _dump_results(outcome)
        blob = encode_settle(outcome.done, outcome.errors, outcome.fatal, results, self.index)
        try:
            await self._call_moving(batch.queue_slot, "settle", batch.lease_id, blob)
        except LeaseExpiredError:
            self._refused += 1
            logger.warning(
                "consumer %d: lease %d expired before it was settled; the queue redelivered "
                "its %d messages and refused this outcome", self.index, batch.lease_id, batch.count,
            )
            return
        if not early:
            self._count(outcome)

    async def _record(self, batch: Batch, outcome: Outcome) -> None:
        ranges = []
        left = outcome.done
        for seg in batch.segments:
            if left <= 0:
                break
            ranges.append((seg.first_seq, min(seg.count, left)))
            left -= seg.count
        await self._call_moving(batch.queue_slot, "record_outcomes", ranges, outcome.errors, _dump_results(outcome),
                                self.index)
        self._count(outcome)

    def _observe(self, done: int, run_s: float) -> None:
        """Count ``done`` tasks that took ``run_s`` in all in the duration histogram."""
        if done <= 0:
            return
        per = run_s / done
        for i, bound in enumerate(DURATION_BUCKETS_S):
            if per <= bound:
                self._duration_buckets[i] += done
        self._duration_count += done
        self._duration_sum_s += run_s

    def _count(self, outcome: Outcome) -> None:
        self._batches += 1
        self._items_done += outcome.done - len(outcome.errors)
        self._items_failed += len(outcome.errors)

    def _adapt(self, done: int, elapsed_s: float) -> None:
        """Size the next batch to about ``target_batch_s`` of work (unless fixed)."""
        if self._fixed_batch is not None or done == 0:
            return
        per_item = elapsed_s / done
        self._per_item_s = per_item if self._per_item_s is None else 0.5 * (self._per_item_s + per_item)
        want = int(self._target_batch_s / max(self._per_item_s, 1e-9))
        # Grow at most 4x per batch so one lucky fast batch does not hoard a slow tail.
        self._batch_size = max(1, min(self._max_batch, want, self._batch_size * 4))

    def _adapt_type(self, batch: Batch, done: int, elapsed_s: float) -> None:
        """The adaptive size, for the one type of ``batch`` (if it holds one)."""
        if self._fixed_batch is not None or done == 0:
            return
        types = {s.type for s in batch.segments}
        if len(types) != 1:
            return
        (t,) = types
        size, per_item_s = self._type_sizes.get(t, (self._batch_size, elapsed_s / done))
        per_item_s = 0.5 * (per_item_s + elapsed_s / done)
        want = int(self._target_batch_s / max(per_item_s, 1e-9))
        self._type_sizes[t] = (max(1, min(self._max_batch, want, size * 4)), per_item_s)

    async def _extend_forever(self) -> None:
        """Every third of the lease timeout, extend the leases of the batches still held."""
        period = self._lease_timeout_s / 3
        while True:
            await asyncio.sleep(period)
            by_slot: dict[int, list[int]] = {}
            for slot, lease_id in list(self._inflight):
                by_slot.setdefault(slot, []).append(lease_id)
            for slot, lease_ids in by_slot.items():
                try:
                    lost = await self._call(slot, "extend", lease_ids)
                except Exception as e:  # one queue's failure must not end the extender
                    logger.warning("consumer %d: extending leases failed: %s: %s",
                                   self.index, type(e).__name__, e)
                    continue
                if lost:
                    logger.warning("consumer %d: leases %s had already expired", self.index, lost)

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
        self._batch_threads[batch.lease_id] = threading.get_ident()
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
            self._batch_threads.pop(batch.lease_id, None)
        return outcome, time.perf_counter() - started

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
            for j, payload in enumerate(seg.payloads()):
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
                        make_id(batch.queue_index, seg.first_seq + j),
                        self._payload_data(seg, payload),
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

    def _payload_data(self, seg: Segment, payload: bytes) -> Any:
        if seg.kind == Kind.RAW:
            return loads(payload)
        func = self._function(seg.digest)
        if seg.kind == Kind.CALL:
            return Task(func, loads(payload))
        args, kwargs = loads(payload)
        return Task(func, args, kwargs)

    def _function(self, digest: bytes | None) -> Any:
        func = self._funcs.get(digest)  # type: ignore[arg-type]
        if func is None:
            data = self._func_bytes.get(digest)  # type: ignore[arg-type]
            if data is None:
                raise LookupError(f"function {digest!r} is unknown to this consumer's queue")
            func = self._funcs[digest] = loads(data)  # type: ignore[index]
        return func

    def metrics_sample(self) -> metrics.ConsumerSample:
        """What ``/metrics`` and the status page show of this consumer (:mod:`daskqueue.metrics`)."""
        from daskqueue.queue.handles import queue_identity

        order = sorted(self._queues, key=lambda i: i != self._home)
        return metrics.ConsumerSample(
            index=self.index, running=self._loop_task is not None, slots=self.max_concurrency + self.reserved_slots,
            running_batches=self._running_batches, done=self._items_done, failed=self._items_failed,
            batches=self._batches, duration_buckets=tuple(self._duration_buckets),
            duration_count=self._duration_count, duration_sum_s=self._duration_sum_s,
            queues=tuple(queue_identity(self._queues[i]) for i in order),
        )


class _Abandoned(Exception):
    """A batch left to a thread that ignored its time limit (see ``_run_watched``)."""


def _worker_address() -> str | None:
    """The address of the worker this runs on (None off a worker)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


def _dump_results(outcome: Outcome) -> bytes:
    """Pickle the results; one that cannot be pickled becomes that message's error."""
    if outcome.results_blob is not None:
        return outcome.results_blob
    try:
        return dumps(outcome.results)
    except Exception:
        for pos, value in enumerate(outcome.results):
            try:
                dumps(value)
            except Exception as e:
                outcome.errors[pos] = error_from_exception(e)
                outcome.fatal.add(pos)
                outcome.results[pos] = None
        return dumps(outcome.results)
