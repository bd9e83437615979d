"""A joblib backend that runs ``Parallel`` on a queue pool: ``backend="daskqueue"``.

::

    with joblib.parallel_config(backend="daskqueue", queue_pool=qp):
        Parallel(n_jobs=-1)(delayed(f)(x) for x in xs)

This module imports joblib; ``import daskqueue`` does not import it (see
:mod:`daskqueue.joblib_hook`, which registers the backend when joblib is imported).

Each joblib batch (a ``BatchedCalls``: several calls, sized by joblib's auto-batching so that
a batch runs 0.2 to 1 s) is one task of the pool (the batch is its argument), sent through the pool's
:class:`~daskqueue.executor.QueueExecutor` (so batches dispatched together go out in one put).
A failed call's exception is raised by ``Parallel`` as joblib does with its other backends:
the task's own type, rebuilt here, chained from the :class:`RemoteTaskError` that holds the
remote traceback. The pool's retries run first (``max_retries``): a pool for joblib work
usually wants ``max_retries=0``, as a deterministic error fails the same way each time.

``n_jobs=-1`` means every slot of the consumer pools started on the queue pool
(``n_consumers * max_concurrency`` each); a larger ``n_jobs`` only dispatches more batches
ahead; ``n_jobs=1`` runs in this process, as joblib does with every backend. joblib itself
runs a call that requires shared memory (``require="sharedmem"``) or prefers threads on its
threading backend instead. ``Parallel`` calls nested inside a task run sequentially in that
task (a consumer slot is one thread of one worker: more would oversubscribe it).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from joblib import register_parallel_backend
from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase, SequentialBackend

from daskqueue.errors import ConfigurationError, NoConsumersError
from daskqueue.executor import ByValue, QueueExecutor

__all__ = ["DaskQueueBackend", "register", "BACKEND_NAME"]

logger = logging.getLogger("daskqueue")

BACKEND_NAME = "daskqueue"


def consumer_slots(queue_pool: Any) -> int:
    """How many tasks the started consumer pools of ``queue_pool`` run at once."""
    return sum(cp.n_consumers * cp.max_concurrency for cp in queue_pool.consumer_pools() if cp.running)


def _call_batch(batch: Callable[[], Any]) -> Any:
    """The task of one joblib batch (run on a worker)."""
    return batch()


class DaskQueueBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's ``"daskqueue"`` backend (see the module docstring). ``queue_pool`` is
    required; other keywords are :meth:`QueuePool.executor`'s options (``priority``,
    ``type``, ``time_limit_s``)."""

    MIN_IDEAL_BATCH_DURATION = 0.2
    MAX_IDEAL_BATCH_DURATION = 1.0
    supports_retrieve_callback = True
    default_n_jobs = -1

    def __init__(self, queue_pool: Any = None, nesting_level: int | None = None,
                 inner_max_num_threads: int | None = None, **executor_options: Any) -> None:
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        if queue_pool is None:
            raise ConfigurationError("the 'daskqueue' joblib backend needs a queue pool: "
                                     "joblib.parallel_config(backend='daskqueue', queue_pool=qp)")
        self.queue_pool = queue_pool
        self.executor_options = executor_options
        self._executor: QueueExecutor | None = None

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is not None and n_jobs > 0:  # n_jobs=1 runs here: no consumer needed
            return n_jobs
        slots = consumer_slots(self.queue_pool)
        if slots == 0:
            raise NoConsumersError(f"joblib's 'daskqueue' backend needs a started ConsumerPool on "
                                   f"{self.queue_pool!r}: Parallel would wait forever")
        return max(slots + 1 + (n_jobs or -1), 1)

    def configure(self, n_jobs: int = 1, parallel: Any = None, prefer: Any = None, require: Any = None,
                  **backend_args: Any) -> int:
        n = self.effective_n_jobs(n_jobs)
        self.parallel = parallel
        if self._executor is not None:  # this instance served an earlier Parallel call
            self._executor.shutdown(wait=False)
        self._executor = self.queue_pool.executor(**self.executor_options)
        return n

    def submit(self, func: Callable[[], Any], callback: Callable[[Any], None] | None = None) -> Any:
        # The batch is the task's argument, not its function: a function is cached by the
        # client's pickler and the queues (so is all it holds), an argument is not, and the
        # message size limit checks arguments. ByValue: the batch holds the user's
        # functions, maybe from __main__ (a script, a notebook).
        if self._executor is None:  # aborted without ensure_ready, or terminated
            self._executor = self.queue_pool.executor(**self.executor_options)
        future = self._executor.submit(_call_batch, ByValue(func))
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def retrieve_result_callback(self, future: Any) -> Any:
        return future.result()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """A call failed: batches not sent yet are cancelled; sent ones run to their end (a
        queue cannot take back a message) and their outcomes are dropped."""
        if self._executor is not None:
            self._executor.cancel_unsent()
            if not ensure_ready:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
        if ensure_ready and self._executor is None:
            self._executor = self.queue_pool.executor(**self.executor_options)

    def terminate(self) -> None:
        if self._executor is not None:
            # Without waiting: after an error, joblib does not wait for the batches in flight.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self.reset_batch_stats()

    def get_nested_backend(self) -> tuple[Any, Any]:
        return SequentialBackend(nesting_level=(self.nesting_level or 0) + 1), None


def register() -> None:
    """Register the ``"daskqueue"`` backend with joblib (idempotent)."""
    register_parallel_backend(BACKEND_NAME, DaskQueueBackend)
