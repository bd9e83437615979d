"""``ConsumerPool``'s daskqueue 0.2.0 spellings: a mixin of the pool (:class:`ConsumerPool020`)
and the helpers its methods call for 0.2.0's arguments.

* ``ConsumerPool(client, qp, ConsumerClass, n_consumers, batch_size, retries, early_ack,
  max_concurrency)`` by position (:func:`positional_020`);
* ``retries=`` (the queue pool's ``max_retries`` now) and ``max_concurrency`` above
  :data:`MAX_THREADS`, read as 0.2.0 meant it (:func:`read_options_020`);
* ``start(timeout)``; ``join(timestep, print_timestep, progress)`` by position or keyword
  (:func:`join_020`): a positional ``join(0.1)`` was 0.2.0's polling interval, so
  ``join``'s timeout is keyword-only;
* ``results()`` nested by consumer (:func:`results_nested`), for a pool made or used with
  0.2.0 spellings (:attr:`ConsumerPool020.old_spellings`, or its queue pool's);
* ``nb_consumed()``, ``len(consumer_pool)``, ``consumer_pool[i]``.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable

from daskqueue.scheduler_query import scheduler_workers
from daskqueue.compat import deprecated, print_logs

__all__ = ["ConsumerPool020", "positional_020", "join_020", "read_options_020", "join_progress_020",
           "results_nested", "nested_results", "MAX_THREADS"]

logger = logging.getLogger("daskqueue")

#: 0.2.0's positional arguments of ``ConsumerPool`` after ``ConsumerClass``, in order.
CONSUMER_POOL_ARGS = ("n_consumers", "batch_size", "retries", "early_ack", "max_concurrency")

#: 0.2.0's positional arguments of ``join``, in order.
JOIN_ARGS = ("timestep", "print_timestep", "progress")

#: The most threads ``max_concurrency`` may ask per consumer; above, it is read as daskqueue
#: 0.2.0 meant it (its default was 10,000: tasks in flight, run on the worker's threads).
MAX_THREADS = 64


def _keywords(what: str, names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Move positional ``args`` into ``kwargs`` under ``names`` (a ``TypeError`` as Python's
    for too many or a name given twice)."""
    if len(args) > len(names):
        raise TypeError(f"{what} takes at most {len(names)} more positional arguments ({', '.join(names)})")
    for name, value in zip(names, args):
        if name in kwargs:
            raise TypeError(f"{what} got multiple values for argument {name!r}")
        kwargs[name] = value


def positional_020(init: Callable[..., None]) -> Callable[..., None]:
    """``ConsumerPool.__init__`` taking 0.2.0's positional arguments after ``ConsumerClass``."""

    @functools.wraps(init)
    def __init__(self: Any, client: Any, queue_pool: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > 1:
            deprecated("ConsumerPool(positional)", "ConsumerPool(client, queue_pool, ConsumerClass, n_consumers, ...): "
                       "daskqueue 0.2.0's positional arguments after ConsumerClass are keywords now: "
                       "ConsumerPool(client, queue_pool, ConsumerClass, n_consumers=...)")
            _keywords("ConsumerPool()", CONSUMER_POOL_ARGS, args[1:], kwargs)
            self.old_spellings = True
            args = args[:1]
        init(self, client, queue_pool, *args, **kwargs)

    return __init__


def join_020(join: Callable[..., None]) -> Callable[..., None]:
    """``ConsumerPool.join`` taking 0.2.0's positional ``(timestep, print_timestep,
    progress)``: ``join(0.1)`` polled every 0.1 s, it was not a timeout."""

    @functools.wraps(join)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            deprecated("join(0.1)", f"consumer_pool.join({', '.join(map(repr, args))}): a positional argument is "
                       "daskqueue 0.2.0's polling interval (join waits on the queues now: it is ignored); "
                       "for a timeout write join(timeout=...)")
            _keywords("join()", JOIN_ARGS, args, kwargs)
        return join(self, **kwargs)

    return wrapper


def read_options_020(pool: Any, client: Any, retries: Any, max_concurrency: int) -> int:
    """Warn of 0.2.0's ``retries=``; return ``max_concurrency`` as threads per consumer (a
    value above :data:`MAX_THREADS` is 0.2.0's tasks in flight: the worker's threads)."""
    if retries is not None:
        deprecated("ConsumerPool(retries=)", "ConsumerPool(retries=) is daskqueue 0.2.0's spelling: retries are "
                   "the queue pool's now, QueuePool(max_retries=); this one is not applied")
        pool.old_spellings = True
    if isinstance(max_concurrency, int) and max_concurrency > MAX_THREADS:
        threads = _worker_threads(client)
        deprecated("max_concurrency>threads", f"ConsumerPool(max_concurrency={max_concurrency}) meant, in daskqueue "
                   "0.2.0, a cap on tasks in flight run on the worker's threads; now max_concurrency is the "
                   f"number of threads each consumer runs tasks on: using the worker's {threads}")
        pool.old_spellings = True
        return threads
    return max_concurrency


def _worker_threads(client: Any) -> int:
    """The fewest threads a worker of the cluster has (what 0.2.0 ran tasks on)."""
    try:
        workers = scheduler_workers(client).values()  # asked of the scheduler: the client's cache can be empty
        return max(1, min(w.get("nthreads", 1) for w in workers))
    except Exception:
        return 1


def join_progress_020(pool: Any, timestep: Any, print_timestep: Any, progress: Any) -> Callable[[], None]:
    """What ``join`` runs on each pass for 0.2.0's arguments: with ``progress``, log the
    tasks run every ``print_timestep`` seconds (default 2, as 0.2.0), printed as 0.2.0's
    logger did (:func:`~daskqueue.compat.print_logs`)."""
    if timestep is None and print_timestep is None and progress is None:
        return lambda: None
    deprecated("join(timestep=)", "consumer_pool.join(timestep=, print_timestep=, progress=) is daskqueue "
               "0.2.0's spelling; use join(timeout=) (progress: QueuePool.map(progress=True), "
               "as_completed(), or daskqueue stats)")
    pool.old_spellings = True
    if not progress:
        return lambda: None
    print_logs()
    every = 2.0 if print_timestep is None else float(print_timestep)
    logged = [time.monotonic()]

    def log_progress() -> None:
        if time.monotonic() - logged[0] >= every:
            logged[0] = time.monotonic()
            done = sum(s.items_done + s.items_failed for s in pool.stats())
            logger.info("%r: %s tasks run; still processing", pool, f"{done:,}")

    return log_progress


def results_nested(pool: Any) -> bool:
    """Whether ``results()`` without ``by_consumer`` nests by consumer: for a pool made or
    used with 0.2.0 spellings (its own or its queue pool's), warning once."""
    if not (pool.old_spellings or getattr(pool.queue_pool, "old_spellings", False)):
        return False
    deprecated("results() nested", "consumer_pool.results() of a pool made with daskqueue 0.2.0's spellings is "
               "nested by consumer, {'GeneralConsumer-0': {task_id: value}, ...}, as 0.2.0's was; "
               "write results(by_consumer=True) to keep that, or results(by_consumer=False) for "
               "{task_id: value} (the default of a pool made with today's spellings)")
    return True


def nested_results(pool: Any, clear: bool) -> dict[str, dict[int, Any]]:
    """``{"<ConsumerClass>-<index>": {task_id: value}}`` with every live consumer (``{}``
    if it ran none of them); a task whose consumer is not known (e.g. one that moved
    queue) is under ``"unknown"``. With ``clear``, the results returned are forgotten."""
    flat = pool.queue_pool.results()
    collector = pool.queue_pool.collector
    name = pool.ConsumerClass.__name__
    nested: dict[str, dict[int, Any]] = {f"{name}-{m.index}": {} for m in pool.members.live()}
    for task_id, value in flat.items():
        index = collector.ran_by(task_id)
        nested.setdefault("unknown" if index is None else f"{name}-{index}", {})[task_id] = value
    if clear:
        collector.take(set(flat))
    return nested


class ConsumerPool020:
    """daskqueue 0.2.0's spellings on ``ConsumerPool`` (see the module docstring)."""

    #: Whether this pool was made or used with daskqueue 0.2.0's spellings (then
    #: ``results()`` nests by consumer, as 0.2.0's did).
    old_spellings: bool = False

    def nb_consumed(self) -> int:
        """Tasks run (done or failed) by the live consumers: daskqueue 0.2.0's spelling."""
        deprecated("nb_consumed()", "consumer_pool.nb_consumed() is daskqueue 0.2.0's spelling; use "
                   "sum(s.items_done + s.items_failed for s in consumer_pool.stats())")
        self.old_spellings = True
        return sum(s.items_done + s.items_failed for s in self.stats())  # type: ignore[attr-defined]

    def __bool__(self) -> bool:
        return True  # a pool is truthy (not ``len() > 0``: that spelling is 0.2.0's)

    def __len__(self) -> int:
        deprecated("len(consumer_pool)", "len(consumer_pool) is daskqueue 0.2.0's spelling; use consumer_pool.n_consumers")
        self.old_spellings = True
        return self.n_consumers  # type: ignore[attr-defined,no-any-return]

    def __getitem__(self, index: int) -> Any:
        deprecated("consumer_pool[i]", "consumer_pool[i] is daskqueue 0.2.0's spelling; use consumer_pool.consumers[i]")
        self.old_spellings = True
        return self.consumers[index]  # type: ignore[attr-defined]

    def _start_timeout_020(self, timeout: Any) -> None:
        if timeout is not None:
            deprecated("start(timeout=)", "consumer_pool.start(timeout=) is daskqueue 0.2.0's spelling; use start() "
                       "(an idle consumer long-polls its home queue: ConsumerPool(idle_poll_s=))")
            self.old_spellings = True
