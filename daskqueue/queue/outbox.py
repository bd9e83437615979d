"""The queue actor's outbox: results and dead letters waiting for the client, read with
cursors, and the dead-letter admin (list, replay, purge).

A mixin of :class:`~daskqueue.queue.base.QueueActorBase` (see there why mixins). The result
records are numbered: ``self._results[0]`` is number ``self._results_base``; the client's
cursor is the number of the first record it has not seen, and fetching from a cursor drops
the records before it. Dead letters live in the core, numbered by ``dead_appended``.

``_add_result`` / ``_drop_results`` are storage hooks (a durable queue writes both through).

Records are kept per producer (see :mod:`daskqueue.queue.producer_results`): each carries the
tag of the producer handle that reads it, and a fetch names its producer (0: the pool's
owner) and returns only that producer's records. The numbers stay one sequence for all, and
each producer has its own cursor (:class:`ProducerBook`). A record its producer fetched (or
whose producer is forgotten) is dropped wherever it is: at the front the list shrinks; behind
a record still wanted it is replaced by an empty record (its bytes freed, its number kept), so
one producer's unfetched records never hold back another's. A producer that goes away says so
(``forget_producer``); one that neither puts nor fetches for ``PRODUCER_LIVENESS_S`` is
forgotten too (never the owner), so a crashed producer's records go after that window.

A hand-off gives the successor the cursors, the liveness ages and the forgotten tags. A
durable queue journals only the front drops: reopened, it reads the records dropped behind
the front again. Their producers are then unknown: a record of the owner that it had fetched
is dropped at its next fetch (its cursor is past it); an attached producer's records are
kept for one liveness window from the reopen, dropped then unless it fetches them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import time
from typing import TYPE_CHECKING, Any

from daskqueue.queue.core import Span
from daskqueue.queue.payload import moved_group
from daskqueue.queue.producer_results import ProducerBook, record_producer, split_by_producer
from daskqueue.queue.waiting import wait_event
from daskqueue.segment.format import TOKEN_SIZE
from daskqueue.serialize import PROTOCOL, ResultRecord, encode_put, encode_records

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore
    from daskqueue.queue.functions import FunctionTable

__all__ = ["OutboxMixin"]

logger = logging.getLogger("daskqueue")

DeadRow = tuple[int, int, bytes, Any]  # (seq, attempts, error, meta)

_EMPTY = pickle.dumps([], PROTOCOL)



class OutboxMixin:
    """Remote methods ``record_outcomes``, ``fetch_results``, ``fetch_outcomes``, ``fetch_dead``,
    ``dead_letters``, ``replay_dead``, ``purge``."""

    # Owned by QueueActorBase.
    index: int
    _core: QueueCore
    _funcs: FunctionTable
    _handed_off: bool
    _tokens: dict[bytes, tuple[int, int]]
    _outcome_tokens: dict[bytes, None]
    _remember_token: Any

    def _init_outbox(self) -> None:
        self._results: list[ResultRecord] = []  # records not yet fetched
        self._results_base = 0  # the number (cursor) of self._results[0]
        self._producers = ProducerBook()  # who reads which records, and how far each has read
        self._noticed = 0  # records numbered below this have had their producer noticed
        self._outcome_event: asyncio.Event | None = None

    # -- storage hooks (in memory here) ---------------------------------------------------------

    def _add_result(self, record: ResultRecord) -> None:
        self._results.append(record)

    def _drop_results(self, n: int) -> None:
        del self._results[:n]
        self._results_base += n

    def _blank_result(self, k: int) -> None:
        """Free ``self._results[k]`` (not at the front): an empty record keeps its number."""
        self._results[k] = ResultRecord(self.index, [], [], _EMPTY, None)

    def _hear_producer(self, producer: int) -> None:
        """Producer ``producer`` put messages: it is alive (see ``PRODUCER_LIVENESS_S``)."""
        self._producers.hear(producer, self._now())

    def _notify_outcomes(self) -> None:
        """Wake ``fetch_outcomes`` waiters: new results or dead letters are here."""
        if self._outcome_event is not None:
            self._outcome_event.set()
            self._outcome_event = asyncio.Event()

    def _store_record(self, record: ResultRecord, producers: list[int]) -> None:
        """Keep ``record`` as one record per producer (``producers[i]``: the tag of its
        ``ranges[i]``; the results come cut by the consumer, see ``split_by_producer``)."""
        for piece in split_by_producer(record, producers):
            self._add_result(piece)

    async def record_outcomes(self, ranges: list[tuple[int, int]], errors: dict[int, bytes],
                              results: bytes | dict[int, bytes], consumer: int | None = None,
                              producers: list[int] | None = None, token: bytes | None = None) -> None:
        """Store the outcomes of early-acked messages (already settled; failures are final).
        ``producers[i]`` is the producer tag of ``ranges[i]`` (the consumer read it from the
        delivery; None, from an older consumer: the owner's). ``token``: a call made again
        with the token of one this queue (or its predecessor) stored stores nothing."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        if token is not None and token in self._outcome_tokens:  # kept and handed off (queue/base.py)
            return
        self._start()
        record = ResultRecord(self.index, ranges, sorted(errors), results, errors, consumer)
        self._store_record(record, producers or [0] * len(ranges))
        self._remember_outcome_token(token)
        try:
            self._after_change(self._now())
        finally:  # the results are kept even if storage failed (see DurableQueue)
            self._notify_outcomes()

    # -- reading outcomes ---------------------------------------------------------------------

    async def forget_producer(self, producer: int) -> None:
        """Producer ``producer`` (an attached handle that closed) reads nothing more: drop its
        records (a durable queue journals the drop, as for any fetched record)."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        if producer and not self._handed_off:  # a handed-off queue's records are its successor's
            self._producers.forget(producer)
            self._drop_fetched(self._now())

    async def fetch_results(self, cursor: int) -> tuple[int, bytes]:
        """Records from ``cursor`` on, and the next cursor; drops the records before ``cursor``.

        The records are a pickled list of :class:`~daskqueue.serialize.ResultRecord`; its
        ``final_errors`` are failures of early-acked messages (late-acked failures are retried
        and reach ``fetch_dead`` instead).
        """
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        return self._results_from(cursor)

    def _results_from(self, cursor: int, producer: int = 0, *, plain: bool = False) -> tuple[int, bytes]:
        """Producer ``producer``'s records from ``cursor`` on (the records before it are its,
        fetched), and the next cursor; ``plain``: as ``encode_records`` (``fetch_outcomes``,
        read with ``decode_records``), else a pickled list of records (``fetch_results``)."""
        if self._handed_off:  # its results went to the successor, under the same numbers
            self._check_serving()
        now = self._now()
        if self._producers.hear(producer, now):
            logger.warning("queue %d: producer %d is back after more than %.0f s unheard of; the outcomes "
                           "it had not fetched were dropped", self.index, producer, self._producers.liveness_s)
        self._producers.fetched(producer, cursor)
        self._drop_fetched(now)
        base, results = self._results_base, self._results
        end = base + len(results)
        start = max(0, cursor - base)
        if start == 0 and all(record_producer(r) == producer for r in results):
            mine = results  # one producer (the usual case): no copy
        else:
            mine = [r for r in results[start:] if r.ranges and record_producer(r) == producer]
        return end, encode_records(mine) if plain else pickle.dumps(mine, PROTOCOL)

    def _drop_fetched(self, now: float) -> None:
        """Forget producers unheard of too long; drop the records nobody wants any more:
        the leading ones, and behind them those their producer fetched or that are a
        forgotten producer's (blanked)."""
        book, base, results = self._producers, self._results_base, self._results
        for k in range(max(0, self._noticed - base), len(results)):
            book.notice(record_producer(results[k]), now)
        self._noticed = base + len(results)
        gone = book.expire(now)
        if gone:
            logger.warning("queue %d: producers %s unheard of for %.0f s are forgotten with their outcomes",
                           self.index, gone, book.liveness_s)
        n = 0
        while n < len(results) and not book.wanted(results[n], base + n):
            n += 1
        if n:
            self._drop_results(n)
        base, results = self._results_base, self._results
        for k, record in enumerate(results):
            if record.ranges and not book.wanted(record, base + k):
                self._blank_result(k)

    async def fetch_outcomes(self, cursor: int, dead_cursor: int, wait_s: float = 0.0,
                             producer: int = 0) -> tuple[int, bytes, int, list[DeadRow]]:
        """``fetch_results`` and ``fetch_dead`` in one call, for producer ``producer`` (0: the
        pool's owner; dead letters are all returned, with their meta naming their producer);
        if neither has anything new, wait up to ``wait_s`` for an outcome to arrive (a long
        poll, not a loop)."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        end = self._results_base + len(self._results)
        if wait_s > 0 and cursor >= end and dead_cursor >= self._core.dead_appended:
            assert self._outcome_event is not None
            await wait_event(self._outcome_event, wait_s)
            if self._paused is not None:  # a pause may have begun during the wait
                await self._unpaused()
        # Read without a yield to the loop in between: one consistent answer.
        cursor, blob = self._results_from(cursor, producer, plain=True)
        dead_cursor, dead = self._dead_from(dead_cursor)
        return cursor, blob, dead_cursor, dead

    async def fetch_dead(self, cursor: int) -> tuple[int, list[DeadRow]]:
        """Dead letters from index ``cursor`` on: ``(seq, attempts, error, meta)`` each."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        return self._dead_from(cursor)

    def _dead_from(self, cursor: int) -> tuple[int, list[DeadRow]]:
        dead = self._core.dead_since(cursor)
        return self._core.dead_appended, [(d.seq, d.attempts, d.error, d.chunk.meta) for d in dead]

    # -- dead-letter admin ----------------------------------------------------------------------

    async def dead_letters(self, limit: int | None = None, seqs: list[int] | None = None) -> bytes:
        """The dead letters (the first ``limit``, or those with these ``seqs``), oldest first,
        as one pickle (read it with :func:`~daskqueue.serialize.dead_rows`) of rows
        ``(seq, attempts, error, wall time, kind, function digest, type, key, priority,
        payload or None)``: the payload is its pickle's bytes, or for a packed message a
        :class:`~daskqueue.serialize.PackedRef` (read both with
        :func:`~daskqueue.serialize.load_payload`). One pickle, so that the rows of one
        packed chunk carry its blob once."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._check_serving()
        wanted = None if seqs is None else set(seqs)
        dead = [d for d in self._core.dead if wanted is None or d.seq in wanted]
        if limit is not None:
            dead = dead[:limit]
        offset = time.time() - self._now()
        out = []
        for d in dead:
            meta, payload = d.chunk.meta, d.chunk.payload
            data = None if payload is None else payload.listed(d.index)  # this queue never unpickles it
            out.append((d.seq, d.attempts, d.error, d.at + offset,
                        getattr(meta, "kind", None), getattr(meta, "digest", None), d.chunk.type, d.chunk.key,
                        d.chunk.priority, data))
        return pickle.dumps(out, PROTOCOL)

    async def replay_dead(self, seqs: list[int] | None = None) -> list[tuple[int, int, int, int]]:
        """Put dead letters (all, or those with these ``seqs``) back as new ready messages,
        attempts reset; then forget them as dead letters. Returns ``(old seq, 1, this queue,
        new seq)`` per message: the client reports their outcomes under their old ids. A dead
        letter whose payload was not kept (stores older than this format) stays dead."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        wanted = None if seqs is None else set(seqs)
        dead = [d for d in self._core.dead if (wanted is None or d.seq in wanted) and d.chunk.payload is not None
                and d.chunk.meta is not None]
        if not dead:
            return []
        groups = [moved_group(Span(d.chunk, d.index, d.index + 1), 0.0) for d in dead]
        funcs = {g.digest: self._funcs[g.digest] for g in groups if g.digest is not None and g.digest in self._funcs}
        # The unwrapped put (queue/base.py ``_put_now``): no await before the moved record.
        ranges = await self._put_now(encode_put(groups, funcs), os.urandom(TOKEN_SIZE))  # type: ignore[attr-defined]
        self._note_replayed(dead, ranges)  # type: ignore[attr-defined]  # attached producers' (queue/moving.py)
        if self._paused is not None:
            await self._unpaused()
        self._core.take_dead({d.seq for d in dead})
        self._after_change(self._now())
        logger.info("queue %d: %d dead letters replayed", self.index, len(dead))
        return [(d.seq, 1, self.index, first) for d, (first, _) in zip(dead, ranges)]

    async def purge(self, dead: bool = True, ready: bool = False, seqs: list[int] | None = None) -> tuple[int, int]:
        """Drop the dead letters (``dead``: all, or those with these ``seqs``) and the waiting
        messages (``ready``: ready and delayed ones; leased ones finish). Returns ``(dead
        letters, waiting messages)`` dropped."""
        if self._paused is not None:  # the gate; see _unpaused
            await self._unpaused()
        self._start()
        n_dead = len(self._core.take_dead(None if seqs is None else set(seqs))) if dead else 0
        n_ready = self._core.purge_waiting() if ready else 0
        self._after_change(self._now())
        if n_ready:
            self._work_changed()
        if n_dead or n_ready:
            logger.warning("queue %d: purged %d dead letters and %d waiting messages", self.index, n_dead, n_ready)
        return n_dead, n_ready
