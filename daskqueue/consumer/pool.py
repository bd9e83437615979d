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
from daskqueue.queue.pool import QueuePool

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
        for name, value, low in [
            ("n_consumers", n_consumers, 1), ("max_concurrency", max_concurrency, 1),
            ("prefetch_batches", prefetch_batches, 0), ("max_batch_size", max_batch_size, 1),
        ]:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigurationError(f"{name} must be an integer >= {low}, got {value!r}")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ConfigurationError(f"batch_size must be None or an integer >= 1, got {batch_size!r}")
        for name, value in [("idle_poll_s", idle_poll_s), ("target_batch_s", target_batch_s)]:
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigurationError(f"{name} must be a number > 0, got {value!r}")
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

    def _replace_lost(self) -> int:
        """Start a replacement for every consumer whose worker died; return how many."""
        lost = [i for i, f in enumerate(self._futures) if f.status != "finished"]
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
            self.queue_pool._collector.poll()
            # Queues first, then consumers: with early ack a message leaves the queue before
            # it runs, and it is counted by its consumer from before it leaves the queue.
            qstats = self.queue_pool.stats()
            pending = sum(s.pending for s in qstats)
            inflight = 0 if pending else sum(s.inflight_items for s in self.stats())
            if pending == 0 and inflight == 0:
                self.queue_pool._collector.poll()
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
        """``{task_id: return value}`` of every acked task so far (``map`` keeps its own)."""
        self.queue_pool._collector.poll()
        return dict(self.queue_pool._collector.results)

    def result(self, task_id: int, timeout: float | None = None) -> Any:
        """The return value of one task, waiting for it (long-polling its queue).

        Raises its :class:`RemoteTaskError` if it was dead-lettered, and
        :class:`JoinTimeoutError` if it is not settled within ``timeout`` seconds.
        """
        from daskqueue.messages import split_id

        collector = self.queue_pool._collector
        queue_index, _ = split_id(task_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            known, value = collector.outcome(task_id)
            if known:
                if isinstance(value, RemoteTaskError) and task_id in collector.failures:
                    raise value
                return value
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise JoinTimeoutError(timeout or 0.0, {"pending": 1})
            collector.poll(wait_s=min(left, 1.0), queue_index=queue_index)

    def failures(self) -> dict[int, RemoteTaskError]:
        """``{task_id: RemoteTaskError}`` of every dead-lettered task so far."""
        self.queue_pool._collector.poll()
        return dict(self.queue_pool._collector.failures)

    def stats(self) -> list[ConsumerStats]:
        """A :class:`ConsumerStats` per consumer; lost consumers are replaced first."""
        self._replace_lost()
        futures = [c.stats() for c in self.consumers]
        return [f.result() for f in futures]
