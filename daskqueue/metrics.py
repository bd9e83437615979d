"""Prometheus metrics of the daskqueue actors of a worker process, and the snapshot behind them.

Dask's worker serves ``/metrics`` on its HTTP port from ``prometheus_client``'s default
``REGISTRY``. :func:`ensure_registered`, called when a queue or consumer actor starts, adds
:class:`DaskQueueCollector` there (once per process) and gives every worker of the process the
``daskqueue_status`` RPC handler the status page asks (:mod:`daskqueue.status`). Both read
:func:`snapshot`: one plain-data picture of the worker's daskqueue actors, found through
``worker.state.actors``, so the page and ``/metrics`` always show the same numbers. Each
actor offers a public ``metrics_sample()`` (a frozen :class:`QueueSample` or
:class:`ConsumerSample`); this module imports no actor class and reads nothing private.

Metrics (all ``daskqueue_``; per queue, labels ``pool``, ``queue``; per consumer, labels
``pool``, ``consumer`` (its index in its consumer pool) and ``actor`` (its Dask key, which keeps
two consumer pools of one queue pool apart)):

* gauges ``queue_ready_messages``, ``queue_delayed_messages``, ``queue_leased_messages``,
  ``queue_dead_messages`` (dead letters held), ``queue_bytes`` (payload bytes of those
  messages; left out while a durable queue compacts);
* counters ``queue_puts_total``, ``queue_acks_total``, ``queue_retries_total``,
  ``queue_dead_letters_total`` (ever dead-lettered), ``queue_expired_total``,
  ``queue_worker_lost_total``, ``queue_moved_total``, ``queue_purged_total``;
* gauges ``consumer_busy_slots``, ``consumer_slots``; counters ``consumer_tasks_done_total``,
  ``consumer_tasks_failed_total``, ``consumer_batches_total``; histogram
  ``consumer_task_duration_seconds``.

A consumer does not know its pool's name: it is the ``pool`` of one of its queues that lives
in this process, or else what the pool registry on the scheduler says (``daskqueue.registry``:
the keys of each pool's queues and consumers), read in the background with a deadline when a
consumer starts and when a scrape meets a consumer it cannot name; until then ``pool=""``.

Threading: the worker's HTTP and RPC handlers run on the worker's event loop, the thread of
the actors' ``async`` methods, so reads need no lock; nothing a scrape or a status call runs
blocks or awaits (the registry is read on a task of its own).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from daskqueue.defaults import DURATION_BUCKETS_S

__all__ = ["ensure_registered", "snapshot", "families", "install_status_handler", "busy_slots",
           "names_from_registry", "DaskQueueCollector", "STATUS_OP", "QueueSample", "ConsumerSample",
           "payload_bytes", "DURATION_BUCKETS_S"]

logger = logging.getLogger("daskqueue")

#: The worker RPC operation that answers :func:`snapshot` (what the status page calls).
STATUS_OP = "daskqueue_status"

#: Longest wait for the pool registry on the scheduler, and how often a scrape may ask it again.
NAMES_TIMEOUT_S = 2.0
NAMES_REFRESH_S = 5.0

_lock = threading.Lock()
_attempted = False  # registration is tried once per process, whatever its outcome
_names: dict[str, str] = {}  # actor key -> pool name, from the scheduler's registry
_names_task: asyncio.Task[None] | None = None
_names_asked_at = -float("inf")


def ensure_registered() -> None:
    """Register :class:`DaskQueueCollector` with this process's Prometheus registry (once),
    give this worker the status RPC handler, and look up pool names in the background.

    Cheap and idempotent; never raises (without ``prometheus_client`` there are no metrics,
    and the status handler is installed all the same)."""
    global _attempted
    try:
        if not _attempted:
            with _lock:
                if not _attempted:
                    _attempted = True
                    _register_collector()
        worker = _current_worker()
        if worker is not None:
            install_status_handler(worker)
            _refresh_names_soon(worker, force=True)
    except Exception as e:  # metrics must never break an actor
        logger.debug("daskqueue metrics: not registered: %s: %s", type(e).__name__, e)


def _register_collector() -> None:
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        logger.debug("daskqueue metrics: prometheus_client is not installed; no /metrics")
        return
    REGISTRY.register(DaskQueueCollector())


def _current_worker() -> Any:
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):  # not on a worker
        return None


def install_status_handler(worker: Any) -> None:
    """Make ``worker`` answer the ``daskqueue_status`` RPC with its :func:`snapshot`."""
    if STATUS_OP in worker.handlers:
        return

    def daskqueue_status(**_: Any) -> dict[str, Any]:
        return snapshot(worker)

    worker.handlers[STATUS_OP] = daskqueue_status


class DaskQueueCollector:
    """A Prometheus collector of every daskqueue actor of every worker of this process."""

    def describe(self) -> list[Any]:
        return []  # no names to check at registration: collect() runs only when scraped

    def collect(self) -> Iterator[Any]:
        try:
            from distributed.worker import Worker

            snaps = [snapshot(w) for w in list(Worker._instances)]
            yield from families(snaps)
        except Exception as e:  # a scrape must still show Dask's own metrics
            logger.debug("daskqueue metrics: collect failed: %s: %s", type(e).__name__, e)


# -- what the actors offer ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSample:
    """What a queue actor shows of itself (``metrics_sample()``): messages per state, bytes
    held, lifetime totals. ``serving``: False once it is closed or handed to a successor (it
    is then left out). ``bytes`` is None while it cannot be read (a compaction owns the state)."""

    index: int
    pool: str
    kind: str
    serving: bool
    ready: int
    delayed: int
    leased: int
    dead: int  # dead letters held now
    bytes: int | None
    puts: int
    acks: int
    retries: int
    expired: int
    worker_lost: int
    moved: int
    dead_letters: int  # ever dead-lettered: ``dead`` drops when dead letters are replayed or purged
    purged: int

    def row(self) -> dict[str, Any]:
        """The status page's and ``/metrics``' plain-data row (msgpack-able)."""
        row = {f: getattr(self, f) for f in self.__slots__}
        del row["serving"]
        return row


@dataclass(frozen=True, slots=True)
class ConsumerSample:
    """What a consumer actor shows of itself (``metrics_sample()``). ``queues``: ``(Dask key,
    pool name)`` of each of its queues, home first, either part None when it does not know it
    (see :func:`daskqueue.queue.handles.queue_identity`)."""

    index: int
    running: bool
    slots: int  # max_concurrency + reserved_slots
    running_batches: int  # batches handed to its runner, those fetched ahead too
    done: int
    failed: int
    batches: int
    duration_buckets: tuple[int, ...]  # cumulative counts per bound of DURATION_BUCKETS_S
    duration_count: int
    duration_sum_s: float
    queues: tuple[tuple[str | None, str | None], ...] = ()

    def row(self, pool: str) -> dict[str, Any]:
        """The status page's and ``/metrics``' plain-data row (msgpack-able)."""
        return {"index": self.index, "pool": pool, "running": self.running, "slots": self.slots,
                "busy_slots": busy_slots(self.running_batches, self.slots), "done": self.done,
                "failed": self.failed, "batches": self.batches, "duration_buckets": list(self.duration_buckets),
                "duration_count": self.duration_count, "duration_sum_s": self.duration_sum_s}


def payload_bytes(spans: Iterable[tuple[Any, int, int]]) -> int:
    """Payload bytes of ``(payload, start, stop)`` runs of messages (of a packed payload,
    their share of its blob); a payload without ``offsets`` (a chunk restored without its
    bytes) counts none."""
    total = 0
    for payload, start, stop in spans:
        packed = getattr(payload, "packed", 0)
        if packed:
            total += len(payload.data) * (stop - start) // packed
            continue
        offsets = getattr(payload, "offsets", None)
        if offsets is not None:
            total += offsets[stop] - offsets[start]
    return total


# -- the snapshot ------------------------------------------------------------------------------


def snapshot(worker: Any) -> dict[str, Any]:
    """The daskqueue actors ``worker`` holds, as plain data (msgpack-able): ``{"address",
    "queues": {key: {...}}, "consumers": {key: {...}}}``. Queues handed off to a successor
    or closed are left out. Call it on the worker's event loop.

    An actor shows up by offering ``metrics_sample()``, which returns a :class:`QueueSample`
    or a :class:`ConsumerSample`; this module knows no actor class."""
    queues: dict[str, QueueSample] = {}
    consumers: dict[str, ConsumerSample] = {}
    for key, actor in list(worker.state.actors.items()):
        sample = _sample(actor)
        if isinstance(sample, QueueSample):
            queues[key] = sample
        elif isinstance(sample, ConsumerSample):
            consumers[key] = sample
    local_pools = {k: q.pool for k, q in queues.items() if q.pool}
    consumer_rows = {}
    for key, sample in consumers.items():
        pool = _consumer_pool(key, sample, local_pools)
        if pool is None:
            _refresh_names_soon(worker)
        consumer_rows[key] = sample.row(pool or "")
    return {"address": worker.address, "queues": {k: q.row() for k, q in queues.items() if q.serving},
            "consumers": consumer_rows}


def _sample(actor: Any) -> Any:
    offer = getattr(type(actor), "metrics_sample", None)
    return offer(actor) if callable(offer) else None


def busy_slots(running_batches: int, slots: int) -> int:
    """Busy run slots from a consumer's count of batches handed to its runner, which also
    counts a batch fetched ahead while it waits for a thread (up to ``prefetch_batches``
    over the slots): at most ``slots``."""
    return min(running_batches, slots)


def _consumer_pool(key: str, sample: ConsumerSample, local_pools: dict[str, str]) -> str | None:
    """The pool of a consumer's queues (home first) that it, this process or the registry
    knows, or None."""
    for qkey, pool in sample.queues:
        pool = pool or local_pools.get(qkey) or _names.get(qkey)
        if pool:
            return pool
    return _names.get(key)


# -- pool names from the scheduler's registry -------------------------------------------------


def _refresh_names_soon(worker: Any, *, force: bool = False) -> None:
    """Read the registry in the background (at most one read at a time, and unless
    ``force``d, at most every ``NAMES_REFRESH_S``); a later scrape uses what it found."""
    global _names_task, _names_asked_at
    if _names_task is not None and not _names_task.done():
        return
    if not force and time.monotonic() - _names_asked_at < NAMES_REFRESH_S:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _names_asked_at = time.monotonic()
    # Held in _names_task, not awaited: nobody waits for the names; the task ends within
    # NAMES_TIMEOUT_S and the next call starts another only once it has.
    _names_task = loop.create_task(_refresh_names(worker))


async def _refresh_names(worker: Any) -> None:
    from daskqueue.registry import CONSUMERS_KEY, POOLS_KEY

    try:
        pools, consumers = await asyncio.wait_for(asyncio.gather(
            worker.scheduler.get_metadata(keys=[POOLS_KEY], default={}),
            worker.scheduler.get_metadata(keys=[CONSUMERS_KEY], default={}),
        ), NAMES_TIMEOUT_S)
    except Exception as e:
        logger.debug("daskqueue metrics: cannot read the pool registry: %s: %s", type(e).__name__, e)
        return
    found = names_from_registry(pools or {}, consumers or {})
    _names.clear()  # closed pools' actors go: the map stays the size of the live pools
    _names.update(found)


def names_from_registry(pools: dict[str, Any], consumers: dict[str, Any]) -> dict[str, str]:
    """Actor key -> pool name, for every queue and consumer in the registry's entries."""
    out = {}
    for name, entry in pools.items():
        for ref in (entry or {}).get("queues", {}).values():
            out[ref[2]] = name
    for name, by_pool in consumers.items():
        for refs in (by_pool or {}).values():
            for ref in refs or ():
                out[ref[2]] = name
    return out


# -- Prometheus families ----------------------------------------------------------------------

_QUEUE_GAUGES = [("ready", "ready_messages", "Messages ready to be delivered."),
                 ("delayed", "delayed_messages", "Messages waiting for their due time (delay, eta, retry backoff)."),
                 ("leased", "leased_messages", "Messages leased to a consumer (running or fetched)."),
                 ("dead", "dead_messages", "Dead letters held (failed after max_retries)."),
                 ("bytes", "bytes", "Payload bytes of the ready, delayed and leased messages and dead letters.")]
_QUEUE_COUNTERS = [("puts", "puts", "Messages put."),
                   ("acks", "acks", "Messages acked (ran to a result)."),
                   ("retries", "retries", "Messages put back for a retry after a failure."),
                   ("dead_letters", "dead_letters", "Messages dead-lettered."),
                   ("expired", "expired", "Leases that expired (their messages redelivered)."),
                   ("worker_lost", "worker_lost", "Leased messages taken back from a consumer whose worker died."),
                   ("moved", "moved", "Messages handed to another queue of the pool."),
                   ("purged", "purged", "Messages purged, or dead letters replayed as new messages.")]
_CONSUMER_GAUGES = [("busy_slots", "busy_slots", "Run slots running a batch now."),
                    ("slots", "slots", "Run slots (max_concurrency + reserved_slots).")]
_CONSUMER_COUNTERS = [("done", "tasks_done", "Tasks that ran to a result."),
                      ("failed", "tasks_failed", "Task runs that raised (every attempt counts)."),
                      ("batches", "batches", "Batches run and settled.")]


def families(snaps: list[dict[str, Any]]) -> Iterator[Any]:
    """The metric families of :func:`snapshot` results (pure: no Dask, no actors)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.utils import floatToGoString

    queues = [q for s in snaps for q in s["queues"].values()]
    consumers = [(k, c) for s in snaps for k, c in s["consumers"].items()]
    qlabels, clabels = ["pool", "queue"], ["pool", "consumer", "actor"]
    for kinds, cls in ((_QUEUE_GAUGES, GaugeMetricFamily), (_QUEUE_COUNTERS, CounterMetricFamily)):
        for field, name, doc in kinds:
            family = cls(f"daskqueue_queue_{name}", doc, labels=qlabels)
            for q in queues:
                if q[field] is not None:
                    family.add_metric([q["pool"], str(q["index"])], q[field])
            yield family
    for kinds, cls in ((_CONSUMER_GAUGES, GaugeMetricFamily), (_CONSUMER_COUNTERS, CounterMetricFamily)):
        for field, name, doc in kinds:
            family = cls(f"daskqueue_consumer_{name}", doc, labels=clabels)
            for key, c in consumers:
                family.add_metric([c["pool"], str(c["index"]), key], c[field])
            yield family
    hist = HistogramMetricFamily("daskqueue_consumer_task_duration_seconds",
                                 "Run time per task (a batch's tasks count its mean each).", labels=clabels)
    for key, c in consumers:
        buckets = [(floatToGoString(b), n) for b, n in zip(DURATION_BUCKETS_S, c["duration_buckets"])]
        hist.add_metric([c["pool"], str(c["index"]), key], buckets + [("+Inf", c["duration_count"])],
                        c["duration_sum_s"])
    yield hist
