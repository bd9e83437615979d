"""``QueuePool``'s daskqueue 0.2.0 spellings: a mixin of the facade (:class:`QueuePool020`)
and what 0.2.0's ``queue_pool[i]`` and ``QueuePoolActor`` become.

* ``submit(func, ..., timeout=, worker_class=)``: 0.2.0's put timeout and consumer class
  were options, not the task's arguments. ``worker_class`` is always taken as the option;
  ``timeout`` is when ``func`` takes no ``timeout`` argument (otherwise it is ``func``'s, as
  every keyword of ``submit`` is). A ``worker_class`` that does not run tasks raises
  :class:`NotATaskConsumerError` (a ``RuntimeError``, as in 0.2.0).
* ``batch_submit(tasks, sync_mode, worker_class, batch_size)``: the same options, by
  position or keyword; batches are sized by ``put_batch_size`` and sent at once now.
* ``len(queue_pool)``, ``queue_pool[i]`` (a view whose ``qsize()`` answers as 0.2.0's actor
  did, ``.result()`` and all; ``IndexError`` past the end).

Each marks the pool :attr:`old_spellings`: its consumer pools' ``results()`` then nest by
consumer, as 0.2.0's did (see :mod:`daskqueue.compat.consumer_pool`).
"""

from __future__ import annotations

import functools
import inspect
import sys
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Sequence

from daskqueue.compat import deprecated
from daskqueue.errors import ConfigurationError, NotATaskConsumerError
from daskqueue.queue.submitting import Submitting

__all__ = ["QueuePool020", "QueueView", "QueuePoolActor"]

_OPTIONS = ("sync_mode", "worker_class", "batch_size")


def _takes_keyword(func: Callable[..., Any], name: str) -> bool:
    """Whether ``func`` accepts the keyword ``name`` (True when its signature is unknown:
    then the keyword is passed on, as every keyword of ``submit`` is)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind == p.VAR_KEYWORD or (p.name == name and p.kind != p.POSITIONAL_ONLY) for p in params)


def _runs_tasks(worker_class: Any) -> bool:
    """Whether ``worker_class`` is a ``GeneralConsumer`` (sub)class. No subclass can exist
    before its module is imported, so the module is looked up, not imported: an import
    here would close a cycle (queue.pool -> this mixin -> the consumer package -> get_pool()'s
    handles -> queue.pool)."""
    general = sys.modules.get("daskqueue.consumer.general")
    return (general is not None and isinstance(worker_class, type)
            and issubclass(worker_class, general.GeneralConsumer))


def _check_worker_class(worker_class: Any) -> None:
    if not _runs_tasks(worker_class):
        raise NotATaskConsumerError(
            f"worker_class={worker_class!r}: tasks run on a GeneralConsumer (0.2.0's worker_class is not "
            "needed: drop it, and give the consumer class to ConsumerPool(ConsumerClass=))")


class QueuePool020:
    """daskqueue 0.2.0's spellings on ``QueuePool`` (see the module docstring)."""

    #: Whether this pool was made or used with daskqueue 0.2.0's spellings (then its
    #: consumer pools' ``results()`` nest by consumer, as 0.2.0's did).
    old_spellings: bool = False

    # The current methods' docs and signatures are what help() shows: these only take the
    # old options off before handing the call on.
    @functools.wraps(Submitting.submit)
    def submit(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        if "worker_class" in kwargs or ("timeout" in kwargs and not _takes_keyword(func, "timeout")):
            deprecated("submit(timeout=, worker_class=)",
                       "queue_pool.submit(func, ..., timeout=, worker_class=): daskqueue 0.2.0's put timeout and "
                       "consumer class are not needed (a put returns at once; tasks run on GeneralConsumer): drop them")
            self.old_spellings = True
            kwargs.pop("timeout", None)
            if "worker_class" in kwargs:
                _check_worker_class(kwargs.pop("worker_class"))
        return super().submit(func, *args, **kwargs)  # type: ignore[misc]

    @functools.wraps(Submitting.batch_submit)
    def batch_submit(self, tasks: Iterable[Sequence[Any]], *old: Any, **kwargs: Any) -> list[int]:
        if len(old) > len(_OPTIONS):
            raise TypeError(f"batch_submit() takes at most {1 + len(_OPTIONS)} positional arguments")
        given = dict(zip(_OPTIONS, old))
        for name in _OPTIONS:
            if name in kwargs:
                if name in given:
                    raise TypeError(f"batch_submit() got multiple values for argument {name!r}")
                given[name] = kwargs.pop(name)
        if given:
            deprecated("batch_submit(sync_mode=, worker_class=, batch_size=)",
                       "queue_pool.batch_submit(tasks, sync_mode=, worker_class=, batch_size=): daskqueue 0.2.0's "
                       "options are not needed (tasks are encoded in put_batch_size batches and sent at once): "
                       "drop them")
            self.old_spellings = True
            if "worker_class" in given:
                _check_worker_class(given["worker_class"])
        return super().batch_submit(tasks, **kwargs)  # type: ignore[misc]

    def _accept_020_durability(self, durability: Any) -> Any:
        """``Durability.DURABLE`` / ``TRANSIENT`` (0.2.0's enum; taking the name warned) as
        today's ``"durable"`` / ``"transient"``."""
        from daskqueue.compat.durability import durability_name

        name, old = durability_name(durability)
        if old:
            self.old_spellings = True
        return name

    def __bool__(self) -> bool:
        return True  # a pool is truthy (not ``len() > 0``: that spelling is 0.2.0's)

    def __len__(self) -> int:
        deprecated("len(queue_pool)", "len(queue_pool) is daskqueue 0.2.0's spelling; use queue_pool.n_queues")
        self.old_spellings = True
        return self.n_queues  # type: ignore[attr-defined,no-any-return]

    def __getitem__(self, i: int) -> QueueView:
        deprecated("queue_pool[i]", "queue_pool[i] is daskqueue 0.2.0's spelling; use queue_pool.stats()[i].pending "
                   "for its size, or queue_pool.queues[i] for the queue actor")
        self.old_spellings = True
        return QueueView(self, self.queue_indices[i])  # type: ignore[attr-defined]


class QueueView:
    """What 0.2.0's ``queue_pool[i]`` gave, as far as it is kept: ``qsize()`` returns a
    finished future of the queue's unsettled messages (0.2.0 counted ready and delivered
    ones). The queue actor's other 0.2.0 methods are out of scope."""

    def __init__(self, pool: Any, index: int) -> None:
        self.pool = pool
        self.index = index

    def __repr__(self) -> str:
        return f"<queue {self.index} of {self.pool!r}>"

    def qsize(self) -> Future[int]:
        future: Future[int] = Future()
        future.set_result(self.pool.get_queue_size()[self.index])
        return future

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"queue_pool[i].{name}: the 0.2.0 queue actor's methods are out of scope (only qsize() "
                             "is kept); use queue_pool.put / put_many / submit, queue_pool.stats(), or "
                             "queue_pool.queues[i] for the queue actor")


class QueuePoolActor:
    """0.2.0's internal pool actor: out of scope. Creating one raises, saying what to use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigurationError("QueuePoolActor was daskqueue 0.2.0's internal pool actor and is out of scope; "
                                 "use QueuePool(client, n_queues) and its submit / put_many / get_queue_size")
