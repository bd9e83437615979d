"""``ConsumerPool``: the client-side handle of a pool of consumer actors."""

from __future__ import annotations

import logging
import time
from typing import Any

from distributed import Client

from daskqueue import defaults
from daskqueue.consumer.base import ConsumerBase, ConsumerStats
from daskqueue.consumer.general import GeneralConsumer
from daskqueue.errors import ConfigurationError, JoinTimeoutError, RemoteTaskError
from daskqueue.queue.handles import is_lost_worker
from daskqueue.queue.pool import QueuePool
from daskqueue.validate import check_number

__all__ = ["ConsumerPool"]

logger = logging.getLogger("daskqueue")


class ConsumerPool:
    """``n_consumers`` consumer actors working on the queues of ``queue_pool``.

    Consumer ``i`` lives on worker ``i mod n_workers`` and calls queue ``i mod n_queues`` its
    home; when the home queue is empty it takes work from the others, so every queue drains
    even with fewer consumers than queues.

    Parameters (keyword-only after ``queue_pool``):

    * ``ConsumerClass``: a :class:`ConsumerBase` subclass (default :class:`GeneralConsumer`).
    * ``n_consumers``: default one per worker.
    * ``batch_size``: messages per fetch; ``None`` (default) adapts it to about
      ``target_batch_s`` (50 ms) of work per batch, from 32 up to ``max_batch_size``.
    * ``max_concurrency`` (default 1): threads per consumer running items; at most this many
      batches run and at most ``prefetch_batches`` (default 1) more wait, per consumer.
    * ``early_ack`` (default False): ack a batch as soon as it is fetched. Faster settlement,
      but a crash loses the batch and failures are not retried (at-most-once).
    * ``consumer_kwargs``: extra keyword arguments for ``ConsumerClass``.
    """

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
        consumer_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(queue_pool, QueuePool):
            raise ConfigurationError(f"queue_pool must be a QueuePool, got {type(queue_pool).__name__}")
        if not (isinstance(ConsumerClass, type) and issubclass(ConsumerClass, ConsumerBase)):
            raise ConfigurationError(f"ConsumerClass must subclass ConsumerBase, got {ConsumerClass!r}")
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        if n_consumers is None:
            n_consumers = max(1, len(workers))
        check_number("n_consumers", n_consumers, integer=True, at_least=1)
        check_number("max_concurrency", max_concurrency, integer=True, at_least=1)
        check_number("prefetch_batches", prefetch_batches, integer=True, at_least=0)
        check_number("max_batch_size", max_batch_size, integer=True, at_least=1)
        check_number("batch_size", batch_size, integer=True, at_least=1, none_ok=True)
        check_number("idle_poll_s", idle_poll_s, above=0)
        check_number("target_batch_s", target_batch_s, above=0)
        self.client = client
        self.queue_pool = queue_pool
        self.ConsumerClass = ConsumerClass
        self.n_consumers = n_consumers
        self.early_ack = early_ack
        options = dict(
            batch_size=batch_size,
            max_concurrency=max_concurrency,
            prefetch_batches=prefetch_batches,
            early_ack=early_ack,
            lease_timeout_s=queue_pool.lease_timeout_s,
            idle_poll_s=idle_poll_s,
            target_batch_s=target_batch_s,
            max_batch_size=max_batch_size,
            **(consumer_kwargs or {}),
        )
        self._options = options
        self._futures = [
            self._spawn(i, workers=[workers[i % len(workers)]]) for i in range(n_consumers)
        ]
        self.consumers = [f.result() for f in self._futures]
        self.replaced = 0
        self._started = False

    def _spawn(self, i: int, *, workers: list[str] | None = None) -> Any:
        return self.client.submit(
            self.ConsumerClass, i, self.queue_pool.queues, home=i % self.queue_pool.n_queues,
            **self._options, actor=True, pure=False, workers=workers,
            allow_other_workers=workers is not None,
        )

    def _lost(self) -> list[int]:
        """Indices of the consumers whose worker died (as far as Dask knows)."""
        return [i for i, f in enumerate(self._futures) if f.status != "finished"]

    def _replace_lost(self) -> int:
        """Start a replacement for every consumer whose worker died; return how many."""
        lost = self._lost()
        for i in lost:
            logger.warning("consumer %d was lost with its worker; starting a replacement", i)
            self._futures[i] = self._spawn(i)
            self.consumers[i] = self._futures[i].result()
            if self._started:
                self.consumers[i].start().result()
        self.replaced += len(lost)
        return len(lost)

    def __repr__(self) -> str:
        state = "started" if self._started else "stopped"
        return f"<ConsumerPool: {self.n_consumers} x {self.ConsumerClass.__name__} ({state})>"

    def _repr_html_(self) -> str:
        return f"<div><strong>ConsumerPool</strong>: {self.n_consumers} x {self.ConsumerClass.__name__}</div>"

    # -- lifetime -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start every consumer (idempotent)."""
        self._replace_lost()
        for f in [c.start() for c in self.consumers]:
            f.result()
        self._started = True

    def cancel(self) -> None:
        """Stop every consumer: running items finish, fetched-but-unstarted ones are released
        back to their queues, every fetched batch is settled. ``start()`` resumes."""
        self._replace_lost()
        for f in [c.stop() for c in self.consumers]:
            f.result()
        self._started = False

    def join(self, timeout: float | None = None) -> None:
        """Wait until every message in the pool's queues is settled (acked or dead-lettered)
        and no consumer holds work; fetch results on the way.

        Raises :class:`JoinTimeoutError` with the counts after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # Work held by a lost consumer comes back to its queue; a replacement keeps the
            # pool at strength for it (joining is an action, unlike stats()).
            self._replace_lost()
            self.queue_pool.poll_outcomes()
            # Queues first, then consumers: with early ack a message leaves the queue before
            # it runs, and it is counted by its consumer from before it leaves the queue.
            qstats = self.queue_pool.stats()
            pending = sum(s.pending for s in qstats)
            inflight = 0 if pending else sum(s.inflight_items for s in self.stats())
            if pending == 0 and inflight == 0:
                self.queue_pool.poll_outcomes()
                return
            if deadline is not None and time.monotonic() > deadline:
                counts = {
                    "ready": sum(s.ready for s in qstats),
                    "delayed": sum(s.delayed for s in qstats),
                    "leased": sum(s.leased for s in qstats),
                    "acked": sum(s.total_acked for s in qstats),
                    "dead": sum(s.dead for s in qstats),
                    "running_in_consumers": inflight,
                }
                raise JoinTimeoutError(timeout or 0.0, counts)
            time.sleep(defaults.POLL_INTERVAL_S)

    def close(self) -> None:
        """Stop every consumer and shut its threads down."""
        for f in [c.close() for c in self.consumers]:
            try:
                f.result()
            except Exception as e:
                logger.warning("closing a consumer failed: %s", e)
        self._started = False

    # -- outcomes -----------------------------------------------------------------------------

    def results(self) -> dict[int, Any]:
        """``{task_id: return value}`` of every acked task so far (``map`` keeps its own);
        :meth:`QueuePool.results`."""
        return self.queue_pool.results()

    def result(self, task_id: int, timeout: float | None = None) -> Any:
        """The return value of one task, waiting for it (long-polling its queue).

        Raises its :class:`RemoteTaskError` if it was dead-lettered, and
        :class:`JoinTimeoutError` if it is not settled within ``timeout`` seconds;
        :meth:`QueuePool.result`.
        """
        return self.queue_pool.result(task_id, timeout_s=timeout)

    def failures(self) -> dict[int, RemoteTaskError]:
        """``{task_id: RemoteTaskError}`` of every dead-lettered task so far;
        :meth:`QueuePool.failures`."""
        return self.queue_pool.failures()

    def stats(self) -> list[ConsumerStats]:
        """A :class:`ConsumerStats` per live consumer, in consumer order (see each one's
        ``index``). A consumer whose worker died is left out with a warning; ``start()``,
        ``cancel()`` and ``join()`` replace it. Starts nothing."""
        lost = set(self._lost())
        calls = [(i, c.stats()) for i, c in enumerate(self.consumers) if i not in lost]
        out = []
        for i, future in calls:
            try:
                out.append(future.result())
            except Exception as e:
                if not is_lost_worker(e):
                    raise
                lost.add(i)  # died since Dask last said
        if lost:
            logger.warning("consumers %s were lost with their workers; stats leave them out", sorted(lost))
        return out
