"""Waiting for outcomes: what both pools' ``results``, ``result``, ``map``, ``join`` and
``as_completed`` are made of.

The :class:`~daskqueue.results.ResultCollector` fetches and files outcomes; an
:class:`Outcomes` waits for them. Every wait has a deadline that reaches the calls it makes
(a queue whose event loop is blocked costs the caller its timeout, no more: the timeout is
reported as :class:`JoinTimeoutError`), and every wait that needs consumers raises
:class:`NoConsumersError` once work is pending and none is started. A ``join`` that returns
over failed tasks says so (a warning with the counts): it returns normally either way.
``as_completed``'s two ways through its outcomes are :mod:`daskqueue.outcome_batches`'.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Iterator

from daskqueue import defaults, outcome_rest
from daskqueue.compat import warn_at_user
from daskqueue.errors import (
    QueueCallTimeoutError,
    JoinTimeoutError,
    NoConsumersError,
    QueueMovedError,
    RemoteTaskError,
)
from daskqueue.outcome_batches import Batch, CompletedBatches
from daskqueue.queue.table import QueueTable
from daskqueue.results import PRIME_MAX_MESSAGES, MapClaim, ResultCollector
from daskqueue.stream_claim import id_runs

__all__ = ["Outcomes", "join_counts"]

logger = logging.getLogger("daskqueue")

#: How often ``join`` asks the queues' and consumers' stats while outcomes of this client's
#: own messages are still to come (see :meth:`Outcomes.join`).
JOIN_STATS_EVERY_S = 0.5

#: A ``map`` that sleeps after an empty round (many outcomes to come, see
#: :meth:`Outcomes._rest`) sleeps this long first where the outcomes' pace is unknown or the
#: map may be ending, twice as long after each round that stays empty, up to
#: ``POLL_INTERVAL_S`` (:mod:`daskqueue.outcome_rest`).
FIRST_REST_S = outcome_rest.FIRST_REST_S


def join_counts(qstats: list[Any], inflight: int) -> dict[str, int]:
    """What a :class:`JoinTimeoutError` of ``join`` reports."""
    return {
        "ready": sum(s.ready for s in qstats),
        "delayed": sum(s.delayed for s in qstats),
        "leased": sum(s.leased for s in qstats),
        "acked": sum(s.total_acked for s in qstats),
        "dead": sum(s.dead for s in qstats),
        "running_in_consumers": inflight,
    }


def _graced(deadline: float | None) -> float | None:
    """The deadline of a call made within a wait until ``deadline`` (see ``CALL_GRACE_S``)."""
    return None if deadline is None else deadline + defaults.CALL_GRACE_S


def _timed_out(timeout_s: float | None, error: QueueCallTimeoutError) -> JoinTimeoutError:
    out = JoinTimeoutError(timeout_s or 0.0, {"unanswered_queue": error.queue_index})
    out.__cause__ = error
    return out


class Outcomes(CompletedBatches):
    """Waiting for the outcomes of one queue pool (its ``collector`` and ``table``);
    ``consumers_running()`` says whether any consumer pool of it is started."""

    def __init__(self, collector: ResultCollector, table: QueueTable, *,
                 consumers_running: Callable[[], bool]) -> None:
        self.collector = collector
        self.table = table
        self._consumers_running = consumers_running
        #: (outcomes, dead letters) of this producer received when the last ``join`` ended.
        self._joined_counts = (0, 0)

    def poll(self, *, wait_s: float = 0.0, queue_index: int | None = None, deadline: float | None = None,
             first: bool = False) -> int:
        """Fetch the outcomes the queues hold (see ``QueuePool.poll_outcomes``), within a
        wait until ``deadline`` (``first``: see ``ResultCollector.poll``)."""
        return self.collector.poll(wait_s=wait_s, queue_index=queue_index, deadline=_graced(deadline), first=first)

    def stats(self, deadline: float | None = None) -> list[Any]:
        """Every queue's stats, asked at once, answered by ``deadline`` (monotonic)."""
        table = self.table
        calls = [(q, table.call(q, "stats")) for q in table.indices()]
        return [table.answer_or_ask_again(q, pending, deadline) for q, pending in calls]

    def taken(self, which: str, clear: bool) -> dict[int, Any]:
        """Every result (``"results"``) or failure (``"failures"``) fetched now, as a copy or
        (``clear``) taken."""
        self.poll()
        if not clear:
            return dict(getattr(self.collector, which))
        return self.collector.take_all(which)

    # -- one task -------------------------------------------------------------------------------

    def result(self, task_id: int, timeout_s: float | None) -> Any:
        """The outcome of task ``task_id`` (an id of this pool), long-polling the queue that
        holds it (see ``QueuePool.result``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            return self._wait_for(task_id, deadline, timeout_s)
        except QueueCallTimeoutError as e:
            if deadline is None:
                raise
            raise _timed_out(timeout_s, e) from e

    def _wait_for(self, task_id: int, deadline: float | None, timeout_s: float | None) -> Any:
        while True:
            known, value = self.collector.outcome(task_id)
            if known:
                if isinstance(value, RemoteTaskError) and task_id in self.collector.failures:
                    raise value
                return value
            left = defaults.RESULT_POLL_SLICE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise JoinTimeoutError(timeout_s or 0.0, {"pending": 1})
            wait_s = min(left, defaults.RESULT_POLL_SLICE_S)
            q = self.collector.queue_of(task_id)  # where it is now (it may have moved)
            if q in self.table.removed:  # not followed any more: ask every queue
                self.poll(deadline=deadline)
                self.table.check_scheduler()
                time.sleep(defaults.POLL_INTERVAL_S)
            else:
                self.poll(wait_s=wait_s, queue_index=q, deadline=deadline)

    # -- map ------------------------------------------------------------------------------------

    def wait_map(self, claim: MapClaim, *, bar: Any, deadline: float | None, timeout_s: float | None,
                 errors: str) -> list[Any]:
        """The values of a ``map`` call by input position, once every one is settled."""
        try:
            self._wait_claim(claim, bar, deadline, timeout_s)
        except QueueCallTimeoutError as e:
            if deadline is None:
                raise
            raise _timed_out(timeout_s, e) from e
        if claim.failures:
            if errors == "raise":
                raise claim.failures[min(claim.failures)]
            for position, error in claim.failures.items():
                claim.values[position] = error
        return claim.values

    def _wait_claim(self, claim: MapClaim, bar: Any, deadline: float | None, timeout_s: float | None) -> None:
        shown = 0
        rests = outcome_rest.MapRest()
        while not claim.complete:
            arrived = self.poll(deadline=deadline)
            # Checked on every pass, not only when nothing arrived: a long map that keeps
            # completing tasks must still time out.
            if not claim.complete and deadline is not None and time.monotonic() > deadline:
                counts = {"done": claim.settled - len(claim.failures), "failed": len(claim.failures),
                          "pending": claim.n - claim.settled}
                raise JoinTimeoutError(timeout_s or 0.0, counts)
            if arrived == 0:
                self.table.check_scheduler()
                if not self._consumers_running():
                    self._no_consumers(claim, deadline)
                self._rest(claim.n - claim.settled, deadline, timeout_s, rests.next())
            else:
                rests.arrived(time.monotonic(), arrived, claim.n - claim.settled)
            if bar is not None and claim.settled > shown:
                bar.update(claim.settled - shown)
                bar.set_postfix(failed=len(claim.failures), refresh=False)
                shown = claim.settled

    def _no_consumers(self, claim: MapClaim, deadline: float | None) -> None:
        """No consumer pool runs while a map waits: raise :class:`NoConsumersError` as
        ``join`` does, once its messages wait in the queues (outcomes of messages that
        settled meanwhile are fetched first)."""
        pending = sum(s.pending for s in self.stats(_graced(deadline)))
        self.poll(deadline=deadline)
        if pending and not claim.complete and not self._consumers_running():
            raise NoConsumersError(f"map() stopped with {claim.n - claim.settled:,} of {claim.n:,} tasks "
                                   "unsettled: no consumer pool of the queue pool is started (stopped or "
                                   "closed meanwhile)")

    # -- join and as_completed ------------------------------------------------------------------

    def settled_all(self, inflight: Callable[[], int], deadline: float | None, timeout_s: float | None) -> bool:
        """Whether every message of the pool is settled and no consumer holds work
        (``inflight()``: how many items the consumers hold); raises what ``join`` raises
        (no consumers, past the deadline)."""
        # Queues first, then consumers: with early ack a message leaves the queue before
        # it runs, and it is counted by its consumer from before it leaves the queue.
        try:
            qstats = self.stats(_graced(deadline))
        except QueueMovedError:  # a durable queue is still being reopened: wait on
            self.table.check_scheduler()
            if deadline is not None and time.monotonic() > deadline:
                raise
            return False
        except QueueCallTimeoutError as e:
            if deadline is None:
                raise
            raise _timed_out(timeout_s, e) from e
        pending = sum(s.pending for s in qstats)
        running = 0 if pending else inflight()
        if pending == 0 and running == 0:
            return True
        if not self._consumers_running():
            raise NoConsumersError(f"{pending:,} messages are pending and no consumer pool of the "
                                   "queue pool is started: call start() first")
        if deadline is not None and time.monotonic() > deadline:
            raise JoinTimeoutError(timeout_s or 0.0, join_counts(qstats, running))
        return False

    def join(self, inflight: Callable[[], int], timeout_s: float | None,
             on_pass: Callable[[], None] = lambda: None) -> None:
        """Wait until every message is settled and no consumer holds work, fetching
        outcomes on the way (see ``ConsumerPool.join``); ``on_pass`` runs on each pass.

        The queues' and consumers' stats (what decides that the pool is idle) are asked on
        the first pass, then only once this client's own messages all have their outcomes
        (:meth:`unsettled`), every ``JOIN_STATS_EVERY_S`` (others' messages, lost queues,
        a timeout's counts), and when no consumer pool runs: a pass that asked them every
        50 ms cost two round trips and both workers' event loops a call each, for an answer
        that the outcomes still to come already gave. Between passes it waits on a long
        poll (which ends when outcomes arrive), not a sleep (see ``as_completed`` too)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        asked: list[float] = []  # when the stats were last asked (see _stats_due)
        while True:
            self._poll_until(deadline, timeout_s)
            if self._stats_due(asked, deadline) and self.settled_all(inflight, deadline, timeout_s):
                self._poll_until(deadline, timeout_s)
                self.collector.unpark()
                self._report_failures()
                return
            on_pass()
            self.table.check_scheduler()
            self.collector.unpark()  # in the wait, not in the results() call after it
            self._await_outcomes(deadline, timeout_s)

    def _stats_due(self, asked: list[float], deadline: float | None) -> bool:
        """Whether a wait for the pool to be idle asks the stats on this pass (see
        :meth:`join`); ``asked`` holds when they were last asked, and is updated."""
        now = time.monotonic()
        if (asked and self.unsettled() > 0 and now - asked[0] < JOIN_STATS_EVERY_S
                and (deadline is None or now <= deadline) and self._consumers_running()):
            return False
        asked[:] = [now]
        return True

    def _await_outcomes(self, deadline: float | None, timeout_s: float | None, first: bool = False) -> None:
        """Wait up to a poll interval for outcomes: a long poll of every queue, which ends
        as soon as they arrive (they are filed then). A sleep instead cost a stream of
        100,000-task chunks half a poll interval at the end of each chunk."""
        try:
            self.poll(wait_s=defaults.POLL_INTERVAL_S, deadline=deadline, first=first)
        except QueueCallTimeoutError as e:
            if deadline is None:
                raise
            raise _timed_out(timeout_s, e) from e

    def unsettled(self) -> int:
        """This client's messages put and without an outcome yet, as far as its counts tell
        (an outcome delivered twice counts twice, follow-ups submitted by tasks are not put
        here: it may be low, never a reason to stop waiting; see :meth:`join`)."""
        return sum(self.table.put_counts) - sum(self.collector.settled)

    def _rest(self, pending: int | None, deadline: float | None, timeout_s: float | None,
              sleep_s: float | None = None) -> None:
        """Wait after a round that brought nothing. With a few outcomes to come
        (``pending``, None: unknown), up to a poll interval, as a long poll of every queue,
        which ends as soon as an outcome arrives (they are filed then); with many, by
        sleeping ``sleep_s`` (default: a poll interval): the next round then fetches what
        arrived meanwhile in one go, instead of one round per consumer's settlement (the
        client's CPU per task is what bounds a big ``map``; ``map`` passes a sleep that
        follows the outcomes' pace, see :mod:`daskqueue.outcome_rest`)."""
        if pending is not None and pending <= PRIME_MAX_MESSAGES:
            self._await_outcomes(deadline, timeout_s)
        else:
            time.sleep(defaults.POLL_INTERVAL_S if sleep_s is None else sleep_s)

    def _report_failures(self) -> None:
        """Log a warning if messages of this producer (another's are not its: an attached
        client's) were dead-lettered since the last ``join`` ended: a join that returns
        normally over failed tasks must not pass for success."""
        counts = (sum(self.collector.settled), self.collector.dead_received)
        (settled, dead), (settled0, dead0) = counts, self._joined_counts
        self._joined_counts = counts
        failed, done = dead - dead0, max(0, (settled - dead) - (settled0 - dead0))
        if failed <= 0:
            return
        share = f"all {failed:,}" if done == 0 else f"{failed:,} of {failed + done:,}"
        logger.warning("join: %s messages settled since the last join failed (dead-lettered after their "
                       "retries): see failures() (their errors) or dead_letters()", share)
        if done == 0:  # seen even where logging is not configured
            warn_at_user(f"join: all {failed:,} messages settled since the last join failed; see failures()",
                         RuntimeWarning)

    def _poll_until(self, deadline: float | None, timeout_s: float | None) -> int:
        try:
            return self.poll(deadline=deadline)
        except QueueCallTimeoutError as e:
            if deadline is None:
                raise
            raise _timed_out(timeout_s, e) from e

    def batches(self, inflight: Callable[[], int], ids: Iterable[int] | None,
                timeout_s: float | None) -> Iterator[Batch]:
        """The outcomes of ``as_completed``, a poll's worth at a time, each taken."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if ids is not None:
            # A list batch_submit returned lately: its own copy and runs (no copy, no check
            # per id); anything else is copied (the caller may change its list meanwhile).
            known = self.collector.sent_ids.recall(ids) if type(ids) is list else None
            listed, runs = known if known is not None else (list(ids), None)
            if known is None:
                runs = id_runs(listed)
            if runs is not None:
                yield from self._claimed_batches(listed, runs, inflight, deadline, timeout_s)
                return
            ids = listed
        yield from self._taken_batches(inflight, ids, deadline, timeout_s)
