"""Taking outcomes from a ``QueuePool``: ``results``, ``failures``, ``result``,
``poll_outcomes``, and the dead-letter admin (``dead_letters``, ``replay_dead``, ``purge``).

A mixin of the facade: every wait is the pool's ``outcomes``' (shared with the consumer
pool), every admin call :mod:`~daskqueue.queue.deadletters`'. It uses only the pool's public
parts (``client``, ``table``, ``collector``, ``outcomes``, ``queues``) and ``_check_open``.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from daskqueue.errors import ConfigurationError, RemoteTaskError
from daskqueue.messages import split_id
from daskqueue.queue.deadletters import dead_letters, purge, replay_dead
from daskqueue.queue.submitting import not_in_client_loop
from daskqueue.results import DeadLetter
from daskqueue.validate import check_number

__all__ = ["Taking"]

logger = logging.getLogger("daskqueue")


class Taking:
    """Outcomes and dead letters of a pool (see the module docstring)."""

    client: Any
    table: Any
    collector: Any
    outcomes: Any
    queues: list[Any]

    # -- outcomes -----------------------------------------------------------------------------
    #
    # The pool created the ids, so it owns what comes back for them: results ride on the
    # consumers' acks into the queues, and a ResultCollector fetches them with a cursor per
    # queue. Results of map() go to the map call that is waiting, not to results().

    def poll_outcomes(self, *, wait_s: float = 0.0, queue_index: int | None = None) -> int:
        """Fetch the results and dead letters the queues hold (one call per queue, or to queue
        ``queue_index`` only); return how many arrived.

        With ``wait_s``, a queue with nothing new holds the call until an outcome arrives or
        ``wait_s`` passes (a long poll). Thread-safe: polls of several threads overlap, and
        each outcome is filed once. Raises :class:`QueueLostError` for a queue whose worker
        is gone.
        """
        not_in_client_loop(self.client)
        return self.outcomes.poll(wait_s=wait_s, queue_index=queue_index)

    def results(self, *, clear: bool = False) -> dict[int, Any]:
        """``{task_id: return value}`` of every task acked so far (fetched now; a copy).

        The pool keeps every result until it is taken: with ``clear=True`` the results
        returned are forgotten (the next call returns only newer ones). For millions of tasks
        use ``ConsumerPool.as_completed`` (or ``clear=True``) so that client memory stays flat.
        """
        not_in_client_loop(self.client)
        return self.outcomes.taken("results", clear)

    def failures(self, *, clear: bool = False) -> dict[int, RemoteTaskError]:
        """``{task_id: RemoteTaskError}`` of every task dead-lettered so far (fetched now; a
        copy); ``clear=True`` forgets those returned, as for :meth:`results`."""
        not_in_client_loop(self.client)
        return self.outcomes.taken("failures", clear)

    def result(self, task_id: int, timeout_s: float | None = None) -> Any:
        """The return value of task ``task_id``, waiting for it (long-polling its queue).

        Raises its :class:`RemoteTaskError` if it was dead-lettered, and
        :class:`JoinTimeoutError` if it is not settled within ``timeout_s`` seconds (also
        when a queue does not answer in that time).
        """
        check_number("task_id", task_id, integer=True, at_least=0)
        not_in_client_loop(self.client)
        if split_id(task_id)[0] >= len(self.queues):
            raise ConfigurationError(f"task_id {task_id} names queue {split_id(task_id)[0]}; "
                                     f"{self!r} has {len(self.queues)}")
        return self.outcomes.result(task_id, timeout_s)

    # -- dead letters -----------------------------------------------------------------------------

    def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        """The dead-lettered messages (at most ``limit``, oldest first per queue), with their
        payload, error, attempts and when they died. Durable queues keep them across restarts."""
        self._check_open()  # type: ignore[attr-defined]
        return dead_letters(self.table, limit)

    def replay_dead(self, ids: Iterable[int] | None = None) -> int:
        """Put dead-lettered messages (all, or those with these ids) back as ready, attempts
        reset; return how many. Their outcomes come back under their old ids (their failure
        is forgotten meanwhile): ``result(id)`` waits for the new run."""
        self._check_open()  # type: ignore[attr-defined]
        n = replay_dead(self.table, self.collector, ids)
        logger.info("%r: %d dead letters replayed", self, n)
        return n

    def purge(self, *, dead: bool = True, ready: bool = False) -> dict[str, int]:
        """Drop the dead letters (``dead``) and every waiting message (``ready``: ready and
        delayed; running ones finish) of every queue; return the counts dropped."""
        self._check_open()  # type: ignore[attr-defined]
        return purge(self.table, dead=dead, ready=ready)

    def take_outcomes(self) -> list[tuple[int, Any]]:
        """Fetch, then take every outcome received: ``(task_id, value or RemoteTaskError)``."""
        self.poll_outcomes()
        return self.collector.take()
