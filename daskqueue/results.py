"""Client-side collection of results and dead letters from the queues.

Results ride on the consumers' acks into the queue that held the message; the client fetches
them in bulk with a cursor per queue (fetching with a cursor also lets the queue drop what the
client has). Ranges of a ``map`` call are *claimed* so that their results land in the map's
output list by input position instead of in the ``{id: value}`` dict (a
:class:`~daskqueue.map_claim.MapClaim`, re-exported here).

How the fetches go (polls in flight, no lock across the network, holds of sends with
claims): :mod:`daskqueue.outcome_polls`.
"""

from __future__ import annotations

import bisect
import logging
import pickle
import threading
from typing import Any, Callable

from daskqueue.arrivals import Arrivals, Cursor
from daskqueue.claims import ClaimsMixin
from daskqueue.dead_letter import DeadLetter, dead_letter_of
from daskqueue.errors import RemoteTaskError, SerializationError
from daskqueue.map_claim import MapClaim
from daskqueue.messages import decode_error, make_id, split_id
from daskqueue.moved import MovedIds
from daskqueue.outcome_drain import DrainMixin
from daskqueue.outcome_polls import PRIME_MAX_MESSAGES, PRIMED_WAIT_S, PollsMixin, _Fetch
from daskqueue.queue.producer_results import is_moved_record, moved_runs
from daskqueue.sent_ids import SentIds
from daskqueue.serialize import ResultRecord

__all__ = ["ResultCollector", "MapClaim", "DeadLetter", "dead_letter_of", "PRIME_MAX_MESSAGES", "PRIMED_WAIT_S"]

logger = logging.getLogger("daskqueue")


class ResultCollector(ClaimsMixin, PollsMixin, DrainMixin):
    """Fetches results and dead letters from every queue of a pool. Thread-safe."""

    def __init__(
        self,
        n_queues: int,
        call: Callable[..., Any],
        answer: Callable[[int, Any, float | None], Any],
        *,
        producer: int = 0,
    ) -> None:
        """``call(q, method, *args)`` calls a queue actor and returns its future;
        ``answer(q, future, deadline)`` waits for it (the pool's, which name a lost queue
        and keep the deadline). ``producer``: the tag whose outcomes this collector reads
        (0: the pool's owner; see :mod:`daskqueue.producers`), and no other's."""
        self._n = n_queues
        self.producer = producer
        self._call = call
        self._answer = answer
        self._cursors = [0] * n_queues
        self._dead_cursors = [0] * n_queues
        #: Outcomes received per queue (results and final failures): a transient queue lost
        #: with its worker lost the messages put there minus these.
        self.settled = [0] * n_queues
        #: Dead letters of this producer received, in all (what ``join`` warns of).
        self.dead_received = 0
        # Per queue: sorted first seqs of claimed groups, and (count, claim, first position).
        self._claim_starts: list[list[int]] = [[] for _ in range(n_queues)]
        self._claims: list[list[tuple[int, MapClaim, int]]] = [[] for _ in range(n_queues)]
        self._results: dict[int, Any] = {}
        #: Results filed but not yet in the dict: ``(first id, values)`` of consecutive seqs
        #: of one queue. Put in the dict when it is read; an ``as_completed`` claiming their
        #: ids takes them by slice, never through the dict (see :meth:`_hand_over`).
        self._parked: list[tuple[int, list[Any]]] = []
        self.failures: dict[int, RemoteTaskError] = {}
        #: The order the two dicts were filed in (see :meth:`take_since`).
        self._arrivals = Arrivals()
        #: The latest ``batch_submit`` id lists, which ``as_completed`` takes without a check per id.
        self.sent_ids = SentIds()
        self._lock = threading.RLock()
        self._closing: list[MapClaim] = []  # see release_when_complete
        #: Queues removed from the pool (drained, their outcomes fetched): not polled.
        self.removed: set[int] = set()
        # Messages moved to another queue (add_queues / remove_queue / replay_dead) keep
        # their old ids.
        self._moves = MovedIds()
        #: Whether outcomes of moved messages may be in the dicts (see ``ClaimsMixin.claim``);
        #: cleared when the dicts are emptied.
        self._moved_filed = False
        # Which consumer ran what (for results(by_consumer=True)): per queue, runs
        # (first seq, count, consumer index) in arrival order, sorted when asked.
        self._ran: dict[int, list[tuple[int, int, int]]] = {}
        self._ran_sorted: dict[int, tuple[list[int], list[tuple[int, int, int]]]] = {}
        #: The long poll in flight per queue (at most one), and the holds of sends with
        #: claims and the answers they keep aside (see :meth:`holding`).
        self._long: dict[int, _Fetch] = {}
        self._holds: dict[int, int] = {}
        self._held: dict[int, list[tuple[list[ResultRecord], list[Any]]]] = {}

    @property
    def results(self) -> dict[int, Any]:
        """``{task_id: value}`` of the results filed and not taken (of no claim)."""
        if self._parked:
            with self._lock:
                self._unpark()
        return self._results

    @results.setter
    def results(self, value: dict[int, Any]) -> None:
        with self._lock:
            self._unpark()
            self._results = value

    def unpark(self) -> None:
        """Put the parked results in the dict now (``join`` does it while it waits, so that
        ``results()`` after it does not)."""
        if self._parked:
            with self._lock:
                self._unpark()

    def _unpark(self) -> None:
        parked, self._parked = self._parked, []
        update = self._results.update
        for first, values in parked:
            update(zip(range(first, first + len(values)), values))

    def add_queues(self, k: int) -> None:
        """The pool has ``k`` more queues (indices from the current count on)."""
        with self._lock:
            self._n += k
            self._cursors += [0] * k
            self._dead_cursors += [0] * k
            self.settled += [0] * k
            self._claim_starts += [[] for _ in range(k)]
            self._claims += [[] for _ in range(k)]

    def take(self, ids: set[int] | None = None) -> list[tuple[int, Any]]:
        """Remove and return the outcomes received: ``(task_id, value)`` of a success and
        ``(task_id, RemoteTaskError)`` of a failure; only those of ``ids`` if given. Taking
        everything replaces the dicts, so the memory they held is freed."""
        got, values, _ = self.take_since(ids, None)
        return list(zip(got, values))

    def take_since(self, ids: set[int] | None, cursor: Cursor | None) -> tuple[list[int], list[Any], Cursor]:
        """:meth:`take`, as two lists (ids and their outcomes), for a caller that takes
        repeatedly (``as_completed``): it passes back the cursor it got, and only outcomes
        filed since are looked at (None, the first time: all of them).

        Two flat lists rather than a pair per outcome: a batch of 100,000 pairs lived long
        enough to be promoted to the collector's oldest generation, and the full
        collections that followed cost more than all the rest of ``as_completed``."""
        with self._lock:
            results, failures = self.results, self.failures
            if ids is None:
                got = list(results) + list(failures)
                values = list(results.values()) + list(failures.values())
                self.results, self.failures = {}, {}
                self._arrivals.clear()
                self.forget_consumers()
                return got, values, self._arrivals.end()
            new = self._arrivals.since(cursor)
            if new is None:
                got_r, got_f = _wanted(results, ids), _wanted(failures, ids)
            else:
                # An outcome filed twice (at-least-once) is in the log twice: taken once.
                new = list(dict.fromkeys(new))
                got_r = [i for i in new if i in ids and i in results]
                got_f = [i for i in new if i in ids and i in failures] if failures else []
            values = list(map(results.pop, got_r)) + list(map(failures.pop, got_f))
            self._trim_arrivals()
            if not results:
                self.forget_consumers()
            return got_r + got_f, values, self._arrivals.end()

    def take_all(self, which: str) -> dict[int, Any]:
        """Remove and return every result (``which="results"``) or failure (``"failures"``),
        replacing the dict so that its memory is freed."""
        with self._lock:
            out = getattr(self, which)
            setattr(self, which, {})
            if which == "results":
                self.forget_consumers()
            self._trim_arrivals()
            return out

    def _trim_arrivals(self) -> None:
        """Keep the arrival log near the outcomes still held (whoever took the others:
        ``results(clear=True)`` never reads the log, and must not leave it growing)."""
        results, failures = self.results, self.failures
        if not results and not failures:
            self._moved_filed = False
            if len(self._arrivals):
                self._arrivals.clear()
        else:
            self._arrivals.compact(lambda: list(results) + list(failures), len(results) + len(failures))

    def forget_consumers(self) -> None:
        """The results were all taken: who ran them is not asked any more."""
        self._ran, self._ran_sorted = {}, {}

    def ran_by(self, task_id: int) -> int | None:
        """The index of the consumer that ran task ``task_id`` (None if not known)."""
        q, seq = split_id(task_id)
        with self._lock:
            index = self._ran_sorted.get(q)
            if index is None:
                runs = sorted(self._ran.get(q, ()))
                index = self._ran_sorted[q] = ([r[0] for r in runs], runs)
        starts, runs = index
        i = bisect.bisect(starts, seq) - 1
        if i >= 0 and seq < runs[i][0] + runs[i][1]:
            return runs[i][2]
        return None

    def forget_failures(self, ids: list[int]) -> None:
        """These failed tasks run again (replayed): their failures no longer stand."""
        with self._lock:
            for i in ids:
                self.failures.pop(i, None)
            self._trim_arrivals()

    def has_moves(self) -> bool:
        return bool(self._moves)

    def moved(self, runs: list[tuple[int, int, int, int]], old_queue: int) -> None:
        """Messages ``(old first seq, count, new queue, new first seq)`` of ``old_queue``
        moved: their outcomes arrive from the new queue and are reported under the old ids."""
        with self._lock:
            self._moves.add(runs, old_queue)

    def _apply_moved(self, record: ResultRecord) -> None:
        """A moved record (see ``queue/producer_results.moved_record``): messages of this
        producer now in ``record.queue`` were given other ids. Read before their outcomes."""
        for given_first, count, given_queue, new_first in moved_runs(record):
            self._moves.add([(given_first, count, record.queue, new_first)], given_queue)
            for seq in range(given_first, given_first + count) if self.failures else ():
                self.failures.pop(make_id(given_queue, seq), None)  # a replayed dead letter runs again

    def given_id(self, q: int, seq: int) -> tuple[int, int]:
        """``(queue, seq)`` of the id that message ``seq`` of queue ``q`` was given."""
        with self._lock:
            return self._moves.given_id(q, seq)

    def queue_of(self, task_id: int) -> int:
        """The queue where task ``task_id`` is now (it may have moved)."""
        q, seq = split_id(task_id)
        with self._lock:
            # Nothing moved (the usual case): no walk of the moves on every ``result(id)``.
            return self._moves.where(q, seq)[0] if self._moves else q

    def exclusive(self) -> Any:
        """The collector's (re-entrant) lock: while a thread holds it, nothing is filed or
        taken (polls still wait for their answers meanwhile). Sends with claims use
        :meth:`holding` instead, which holds no lock across a network wait."""
        return self._lock

    def outcome(self, task_id: int) -> tuple[bool, Any]:
        """``(True, value)`` or ``(True, RemoteTaskError)`` once known, else ``(False, None)``."""
        if task_id in self.results:
            return True, self.results[task_id]
        if task_id in self.failures:
            return True, self.failures[task_id]
        return False, None

    def _take_results(self, records: list[ResultRecord]) -> int:
        n = 0
        for record in records:
            if is_moved_record(record):  # where messages of this producer moved (no outcomes)
                self._apply_moved(record)
                continue
            q, ranges, final_errors = record.queue, record.ranges, record.final_errors
            consumer = getattr(record, "consumer", None)
            if consumer is not None and not self._claim_starts[q]:
                # Only while results go to the results dict (a map's go to its list), and
                # forgotten with them (take, results(clear=True)): memory stays with them.
                self._ran.setdefault(q, []).extend((first, count, consumer) for first, count in ranges)
                self._ran_sorted.pop(q, None)
            values: list[Any] | None = None
            error: BaseException | None = None
            try:
                values = pickle.loads(record.results)
            except Exception as e:
                error = e
            skip = set(record.failed)
            pos = 0
            for first, count in ranges:
                if values is not None and not (skip and any(pos + k in skip for k in range(count))):
                    self._succeed_range(q, first, values[pos : pos + count])
                    n += count
                    pos += count
                    continue
                for k in range(count):
                    if pos + k in skip:
                        if final_errors and pos + k in final_errors:
                            self._fail(q, first + k, final_errors[pos + k], 1)
                            n += 1
                    elif values is None:
                        self._fail_local(q, first + k, error)  # type: ignore[arg-type]
                        n += 1
                    else:
                        self._succeed_range(q, first + k, values[pos + k : pos + k + 1])
                        n += 1
                pos += count
        return n

    def _succeed_range(self, q: int, first: int, values: list[Any]) -> None:
        """Results of consecutive messages ``first ..`` of queue ``q`` (one put group)."""
        if self._moves.has(q):
            self._moved_filed = True
            for oq, seq, count, offset in self._moves.pieces(q, first, len(values), settle=True):
                self._succeed_here(oq, seq, values[offset : offset + count])
            return
        self._succeed_here(q, first, values)

    def _succeed_here(self, q: int, first: int, values: list[Any]) -> None:
        starts = self._claim_starts[q]
        if not starts:
            self._park(q, first, values)
            return
        # A put group lies within one map's claim, but an as_completed may claim part of one.
        end = first + len(values)
        while first < end:
            i = bisect.bisect(starts, first) - 1
            if i >= 0 and first < starts[i] + self._claims[q][i][0]:
                count, claim, pos0 = self._claims[q][i]
                stop = min(end, starts[i] + count)
                claim.succeed(pos0 + (first - starts[i]), values if stop - first == len(values) else
                              values[:stop - first])
            else:
                stop = min(end, starts[i + 1]) if i + 1 < len(starts) else end
                self._park(q, first, values if stop - first == len(values) else values[:stop - first])
            values = values[stop - first:] if stop < end else values
            first = stop

    def _park(self, q: int, first: int, values: list[Any]) -> None:
        first_id = make_id(q, first)
        self._parked.append((first_id, values))
        # Ids of consecutive seqs are consecutive: a range, not a make_id call each.
        self._arrivals.add(range(first_id, first_id + len(values)))

    def _fail(self, q: int, seq: int, error: bytes, attempts: int) -> None:
        if self._moves.has(q):
            self._moved_filed = True
            q, seq, _, _ = self._moves.pieces(q, seq, 1, settle=True)[0]
        exc_type, message, tb = decode_error(error)
        self._record_failure(q, seq, RemoteTaskError(make_id(q, seq), exc_type, message, tb, attempts))

    def _fail_local(self, q: int, seq: int, cause: BaseException) -> None:
        if self._moves.has(q):
            self._moved_filed = True
            q, seq, _, _ = self._moves.pieces(q, seq, 1, settle=True)[0]
        err = SerializationError(f"result of task {make_id(q, seq)} cannot be unpickled here: {cause}")
        err.__cause__ = cause
        tb = f"{type(cause).__name__}: {cause}"
        remote = RemoteTaskError(make_id(q, seq), "daskqueue.errors.SerializationError", str(err), tb, 1)
        remote.__cause__ = err
        self._record_failure(q, seq, remote)

    def _record_failure(self, q: int, seq: int, error: RemoteTaskError) -> None:
        owner = self._owner(q, seq) if self._claim_starts[q] else None
        if owner is None:
            self.failures[error.task_id] = error
            self._arrivals.add((error.task_id,))
        else:
            claim, position = owner
            claim.fail(position, error)

    def _take_dead(self, q: int, dead: list[tuple[int, int, bytes, Any]]) -> int:
        """File the dead letters of this collector's producer (every producer reads every
        queue's dead letters; each files only its own)."""
        n = 0
        for seq, attempts, error, meta in dead:
            if (getattr(meta, "producer", 0) or 0) == self.producer:
                self._fail(q, seq, error, attempts)
                n += 1
        self.dead_received += n
        return n




def _wanted(found: dict[int, Any], ids: set[int]) -> list[int]:
    """The ids of ``found`` that are in ``ids``, walking whichever of the two is smaller."""
    if not found:
        return []
    if len(found) < len(ids):
        return [i for i in found if i in ids]
    return [i for i in ids if i in found]
