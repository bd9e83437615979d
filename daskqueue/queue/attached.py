"""Handles on a pool that do not own it: attached by name, unpickled, or inside a task.

A :class:`PoolHandle` is a :class:`~daskqueue.queue.pool.QueuePool` made of the same parts
(table, router, sender, collector, outcomes) over queue actors it did not start. It never
starts, moves or closes a queue: closing it only tells the queues that its producer reads
nothing more. When the owner closes the pool, its calls raise :class:`PoolClosedError`. What
a closed, moved or removed queue means to a handle is its table's
(:mod:`daskqueue.queue.attached_table`).

Three kinds (see :mod:`daskqueue.producers` for who gets which):

* *attached* (``QueuePool.attach(client, name)``, a client in any process): a fresh producer
  tag; it reads exactly the outcomes of what it submitted, also of messages the owner moved,
  and follows the queues the owner adds and removes (see :mod:`daskqueue.queue.attached_follow`);
* *task* handles (``get_pool()``, or a pool unpickled on a worker): the producer tag of the
  running message (or of the pool pickled), so that the follow-ups' outcomes go to whoever
  submitted the parent. Such a handle submits but does not read outcomes (they are its
  producer's);
* *map* handles: the sibling a task handle's ``map`` / ``imap`` runs on, with a fresh tag
  whose outcomes it reads (it shares the task handle's queue handles; closed after).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from daskqueue import registry
from daskqueue.errors import ConfigurationError, PoolClosedError, QueueClosedError
from daskqueue.outcomes import Outcomes
from daskqueue.producers import OWNER, ProducerSpec, new_map_tag, new_producer_tag
from daskqueue.queue.attached_follow import HandleCollector, NoQueue, apply_entry, follower_of
from daskqueue.queue.attached_table import HandleTable
from daskqueue.queue.config import PoolConfig
from daskqueue.queue.handles import WorkerActor
from daskqueue.queue.loop_queue import LoopQueue
from daskqueue.queue.pool import QueuePool
from daskqueue.queue.router import Router
from daskqueue.queue.sending import Sender

__all__ = ["PoolHandle", "HandleTable", "LoopQueue", "attach_by_name", "build_handle", "unpickle_pool"]

logger = logging.getLogger("daskqueue")


class ReadsNothing(Outcomes):
    """The outcomes of a task handle: its producer's, not its own, so it reads none."""

    def poll(self, **kwargs: Any) -> int:
        raise ConfigurationError("a pool handle inside a task submits work; the outcomes of that work are "
                                 "read by whoever submitted the task (result(id) with the ids the task "
                                 "returns, results(), as_completed()); map() here reads its own")


class PoolHandle(QueuePool):
    """A handle on a pool this process does not own (see the module docstring)."""

    _role = "attached"

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"<QueuePool {self.name!r} ({self._role} handle, producer {self.producer}): "
                f"{self.n_queues} queues, {state}>")

    def has_running_consumers(self) -> bool:
        """A task handle runs inside a consumer; an attached one asks the registry."""
        if self._role == "task" or self.client is None:
            return True
        try:
            entry = registry.registered_pools(self.client).get(self.name)
        except Exception:  # the registry is for finding pools: let the wait decide
            return True
        if entry is None:
            raise PoolClosedError(self.name, "it is no longer registered")
        return bool(entry.get("consumers"))

    def consumer_pools(self) -> list[Any]:
        return []

    def register_consumer_pool(self, consumer_pool: Any) -> None:
        raise ConfigurationError(f"consumers are started on the pool's owner, not on {self!r}: a handle does "
                                 "not follow the cluster for them")

    def add_queues(self, k: int = 1) -> list[int]:
        raise ConfigurationError(f"only the pool's owner adds queues, not {self!r}")

    def remove_queue(self, index: int, *, timeout_s: float | None = None) -> int:
        raise ConfigurationError(f"only the pool's owner removes queues, not {self!r}")

    def map(self, func: Any, iterable: Any, **kwargs: Any) -> list[Any]:  # type: ignore[override]
        """:meth:`QueuePool.map`; on a task handle, through a sibling handle with a fresh
        map tag (its outcomes are its own), closed after. The tasks it runs cannot enqueue
        follow-ups through ``get_pool()`` (:func:`daskqueue.producers.get_pool` says why)."""
        if self._role != "task":
            return super().map(func, iterable, **kwargs)
        sibling = build_handle(self.spec.with_producer(new_map_tag()), self.table.handles, self.client,
                               role="map", removed=self.table.removed)
        sibling.table.refresh = self.table.refresh  # it follows moves and lost queues as this one does
        try:
            return sibling.map(func, iterable, **kwargs)
        finally:
            sibling.close()

    def imap(self, func: Any, iterable: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """:meth:`QueuePool.imap`; on a task handle through a sibling handle, as :meth:`map`."""
        return self._sibling_stream("imap", func, iterable, kwargs)

    def imap_unordered(self, func: Any, iterable: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """:meth:`QueuePool.imap_unordered`; on a task handle through a sibling handle, as :meth:`map`."""
        return self._sibling_stream("imap_unordered", func, iterable, kwargs)

    def _sibling_stream(self, method: str, func: Any, iterable: Any, kwargs: dict[str, Any]) -> Any:
        # A task handle reads no outcomes (they belong to the parent's producer): a stream on it
        # would put its tasks and then fail at its first wait, their outcomes filed to the parent.
        if self._role != "task":
            return getattr(super(), method)(func, iterable, **kwargs)
        sibling = build_handle(self.spec.with_producer(new_map_tag()), self.table.handles, self.client,
                               role="map", removed=self.table.removed)
        sibling.table.refresh = self.table.refresh
        try:
            stream = getattr(sibling, method)(func, iterable, **kwargs)  # checks its arguments now
        except BaseException:
            sibling.close()
            raise
        return _closing_after(stream, sibling)

    def executor(self, **options: Any) -> Any:
        """:meth:`QueuePool.executor`; refused on a task handle, whose outcomes are the parent's
        producer's (its thread would wait for outcomes it cannot read): use ``map`` or ``imap``."""
        if self._role == "task":
            raise ConfigurationError(f"executor() is not available on {self!r} inside a task: use map() or "
                                     "imap() there (each reads its own outcomes), or an executor on the pool's owner")
        return super().executor(**options)

    def close(self) -> None:
        """Forget this handle: the pool stays open (its owner closes it); the queues drop
        this producer's outcomes not read yet."""
        if self._closed:
            return
        self._closed = True
        if self.producer != OWNER and self._role != "task":
            for q, _ in self.table.in_service():
                try:
                    self.table.answer(q, self.table.call(q, "forget_producer", self.producer))
                except Exception as e:  # best effort: its records then wait in the queue
                    logger.debug("%r: queue %d did not forget producer %d: %s", self, q, self.producer, e)
        if self._role == "attached":  # its handles are its own (a map sibling shares its parent's)
            closed = functools.partial(PoolClosedError, self.name, handle=f"attached handle (producer {self.producer})")
            for handle in self.table.handles:
                release = getattr(type(handle), "release", None)
                if release is not None:  # its lane's sockets and its hold on the actor's key, not left to the GC
                    release(handle, closed)
        logger.info("%r closed (the pool stays open)", self)

    def forget_queue(self, q: int) -> None:
        """The owner removed queue ``q``: route nothing more there, poll it no more."""
        self.table.removed.add(q)
        self.collector.removed.add(q)
        # As the owner's remove_queue: a long poll left in flight there (a send primed it) is
        # dropped now, not at this handle's next poll, which a handle that only puts never makes.
        self.collector.forget(q)
        rest = [i for i in self.router.targets if i != q]
        if rest and rest != self.router.targets:
            self.router.route_to(rest)
            logger.info("%r: queue %d was removed by the pool's owner; routing to %s", self, q, rest)

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosedError(f"{self!r} is closed")
        follow = getattr(self.collector, "follow", None)
        if follow is not None:  # an attached handle: puts go to the queues added since too
            follow()


def build_handle(spec: ProducerSpec, handles: list[Any], client: Any, *, role: str,
                 removed: set[int] = frozenset()) -> PoolHandle:  # type: ignore[assignment]
    """A :class:`PoolHandle` of ``spec``'s pool over queue ``handles`` (by index), for
    producer ``spec.producer``; ``removed``: indices not serving (not routed to)."""
    pool = PoolHandle.__new__(PoolHandle)
    config = spec.config if isinstance(spec.config, PoolConfig) else PoolConfig(**spec.config)
    pool.config, pool.time_limit_s, pool.client, pool.name = config, spec.time_limit_s, client, spec.name
    pool.spec, pool.producer, pool._role, pool._closed = spec, spec.producer, role, False
    n = len(handles)
    pool.collector = HandleCollector(n, pool._call, pool._answer, producer=spec.producer)
    table = HandleTable(config.durability, list(handles), [None] * n, scheduler_lost=_scheduler_lost(client),
                        settled=lambda q: pool.collector.settled[q], dirpath=config.dirpath)
    table.pool_name = spec.name
    table.removed = set(removed)
    pool.table = table
    pool.router = Router([q for q in range(n) if q not in table.removed], typed=config.scheduler != "fifo")
    pool.sender = Sender(table, pool.router, pool.collector, producer=spec.producer)
    outcomes = ReadsNothing if role == "task" else Outcomes
    pool.outcomes = outcomes(pool.collector, table, consumers_running=pool.has_running_consumers)
    table.on_removed = pool.forget_queue
    logger.debug("%r made", pool)
    return pool


def _scheduler_lost(client: Any) -> Any:
    if client is None:
        return lambda: None
    return lambda: None if client.status in ("running", "connecting", "newly-created") else client.status


def _handles_from_refs(refs: dict[int, Any], n: int, *, on_worker: bool,
                       client: Any = None) -> tuple[list[Any], set[int]]:
    """Actor handles by queue index from registry refs (calling through ``client``), and
    the indices with none."""
    handles: list[Any] = []
    missing = set()
    for q in range(n):
        ref = refs.get(q)
        if ref is None:
            handles.append(NoQueue(q))
            missing.add(q)
            continue
        handles.append(_handle_from_ref(ref, on_worker=on_worker, client=client))
    return handles, missing


def _handle_from_ref(ref: Any, *, on_worker: bool, client: Any = None) -> Any:
    actor = registry.actor_from_ref(tuple(ref), client)
    # On a worker, a handle that holds no Dask future (see WorkerActor).
    return WorkerActor(actor._cls, actor._address, actor.key) if on_worker else actor


def attach_by_name(client: Any, name: str, *, producer: int | None = None) -> PoolHandle:
    """A handle on the pool registered as ``name`` on ``client``'s scheduler, for a fresh
    producer tag (or ``producer``). Raises :class:`PoolClosedError` if no open pool has
    that name, :class:`ConfigurationError` for an asynchronous client (attaching blocks)."""
    if getattr(client, "asynchronous", False):
        raise ConfigurationError("QueuePool.attach blocks: give it a synchronous Client (an asynchronous "
                                 "one would get coroutines back from its registry calls)")
    entry = registry.registered_pool(client, name)
    if entry is None or "config" not in entry:
        raise PoolClosedError(name, "no open pool of that name is registered on this scheduler "
                                    "(daskqueue stats lists them)")
    refs = {int(i): ref for i, ref in (entry.get("queues") or {}).items()}
    # By index: a removed queue's index stays taken, so the slots run to the highest index.
    n = max(int(entry["n_queues"]), 1 + max(refs, default=-1))
    handles, missing = _handles_from_refs(refs, n, on_worker=False, client=client)
    spec = ProducerSpec(name, PoolConfig(**entry["config"]), entry.get("time_limit_s"), tuple(refs.get(q) for q in
                        range(len(handles))), new_producer_tag() if producer is None else producer,
                        client.scheduler.address)
    pool = build_handle(spec, handles, client, role="attached" if producer is None else "task", removed=missing)
    pool.table.refresh = lambda q: _registered_handle(client, name, q)
    pool.table.removed_by_owner = lambda q: q in ((registry.registered_pool(client, name) or {}).get("removed") or ())
    # It follows the queues the owner adds and removes (see queue/attached_follow.py).
    pool.collector.follow = follower_of(pool, lambda: registry.registered_pool(client, name),
                                        lambda ref: _handle_from_ref(ref, on_worker=False, client=client))
    apply_entry(pool, entry, lambda ref: _handle_from_ref(ref, on_worker=False, client=client))  # being removed
    logger.info("%r attached", pool)
    return pool


def _registered_handle(client: Any, name: str, q: int, *, on_worker: bool = False) -> tuple[bool, Any]:
    """Whether pool ``name`` is registered, and the handle of its queue ``q`` there now
    (None: not serving, being moved or lost); ``on_worker``: a worker's handle (``client``
    is then a :class:`WorkerRegistry`)."""
    entry = registry.registered_pool(client, name)
    if entry is None:
        return False, None
    ref = (entry.get("queues") or {}).get(str(q))
    return True, None if ref is None else _handle_from_ref(tuple(ref), on_worker=on_worker,
                                                           client=None if on_worker else client)


def _in_worker_process() -> bool:
    """Whether a Dask worker runs in this process (arguments are unpickled on its event loop,
    before the task runs, where ``get_worker()`` does not answer yet; the handles bind to the
    worker on their first call)."""
    from distributed import Worker, get_worker

    try:
        get_worker()
        return True
    except ValueError:
        return any(w.status.name not in ("closed", "closing") for w in list(Worker._instances))


def unpickle_pool(spec: ProducerSpec) -> QueuePool:
    """A pickled ``QueuePool`` arriving somewhere: inside a task of that pool, the running
    consumer's handle; on a worker, a task handle through the worker's connections; in a
    client process, a task handle through the current client."""
    from daskqueue import producers

    source = producers.current_source()
    if source is not None and source.spec.name == spec.name:
        return source(spec.producer)
    on_worker, client = _in_worker_process(), None
    if not on_worker:
        from distributed import get_client

        try:
            client = get_client()
        except ValueError as e:
            raise ConfigurationError(f"a QueuePool ({spec.name!r}) was unpickled in a process with no Dask "
                                     "client or worker: connect a Client first") from e
    refs = dict(enumerate(spec.refs))
    handles, missing = _handles_from_refs({q: r for q, r in refs.items() if r is not None}, len(spec.refs),
                                          on_worker=on_worker)
    pool = build_handle(spec, handles, client, role="task", removed=missing)
    if on_worker:  # it follows its queues' moves in the registry, read through the worker
        reader = WorkerRegistry()
        name = spec.name
        pool.table.refresh = lambda q: _registered_handle(reader, name, q, on_worker=True)
        pool.table.removed_by_owner = lambda q: q in ((registry.registered_pool(reader, name) or {}).get("removed")
                                                      or ())
        pool.table.resting_by_owner = lambda q: q in ((registry.registered_pool(reader, name) or {}).get("resting")
                                                      or ())
    return pool


class WorkerRegistry:
    """The registry's reads (:func:`registry.registered_pool`) from a task handle, which has no
    client: through the worker's own connection to its scheduler (``Worker.scheduler``).

    Without it, a pool unpickled in a plain Dask task never learnt that a queue moved (its
    worker retired and handed it off): a call to the freed actor is never answered (Dask's
    worker-side ``Actor`` drops the error of an actor it no longer has), and the task's puts
    ended in :class:`QueueLostError` after about a minute. Calls block on the worker's event
    loop, so they are made from task threads (a call from the loop itself raises, and the
    table then keeps its own error)."""

    def __init__(self) -> None:
        self._worker: Any = None

    def _the_worker(self) -> Any:
        if self._worker is None:
            from distributed import Worker, get_worker

            try:
                self._worker = get_worker()
            except ValueError:
                self._worker = next(w for w in list(Worker._instances) if w.status.name not in ("closed", "closing"))
        return self._worker

    @property
    def scheduler(self) -> Any:
        return self._the_worker().scheduler

    def sync(self, func: Any, *args: Any, callback_timeout: float | None = None, **kwargs: Any) -> Any:
        from distributed.utils import sync

        return sync(self._the_worker().loop, func, *args, callback_timeout=callback_timeout, **kwargs)


def _closing_after(stream: Any, handle: Any) -> Any:
    """Yield from ``stream``, then close ``handle`` (also when the stream is closed early)."""
    try:
        yield from stream
    finally:
        stream.close()
        handle.close()
