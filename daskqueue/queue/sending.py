"""Sending a submission's encoded batches to the queues, and reading back their ids.

Every batch of a submission is encoded before any is sent; the batches then go out at once
and every answer is collected, even after one failed: messages a queue stored run whether or
not the client hears of it, so their ids are never abandoned. A submission that failed
part-way raises the first error with ``stored_ids`` (by input position, None where not stored)
and, for a lost transient queue, ``lost_messages`` counting the failed puts' messages too.
An interrupted send (Ctrl-C) reads the answers of the puts it sent before it raises; that
reading, and where a Ctrl-C may land meanwhile, are :mod:`daskqueue.queue.interrupted`'s; one
put's way to its queue (rerouted, put again after a move) is :mod:`daskqueue.queue.put_delivery`'s.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Sequence

from daskqueue.errors import ConfigurationError, QueueLostError, QueueMovedError
from daskqueue.messages import id_range, make_id
from daskqueue.queue.encode import PutBatch, encode_keyed
# INTERRUPTED_READ_S is read from this module at each interruption (tests patch it here).
from daskqueue.queue.interrupted import INTERRUPTED_READ_S, InterruptGuard, read_rest
from daskqueue.queue.interrupted import SentPut as _Put
from daskqueue.queue.put_delivery import PutDelivery
from daskqueue.queue.router import Router, consecutive_runs, waves
from daskqueue.queue.table import QueueTable
from daskqueue.results import PRIME_MAX_MESSAGES, MapClaim, ResultCollector
from daskqueue.sent_ids import Run, merge_runs

__all__ = ["Sender", "check_keys"]

logger = logging.getLogger("daskqueue")


def check_keys(keys: Sequence[Any], n: int, *, key: str | None, typed: str | None) -> list[str]:
    """The per-message routing keys of a submission of ``n`` messages, validated
    (``typed``: the scheduler of a pool that routes by type, which refuses keys)."""
    if key is not None:
        raise ConfigurationError("give key= (one key for every message) or keys=, not both")
    if typed is not None:
        raise ConfigurationError(f"keys= routes messages by key; a {typed!r} pool routes "
                                 "them by type: use keys in a 'fifo' pool")
    keys = list(keys)
    if len(keys) != n:
        raise ConfigurationError(f"keys has {len(keys)} keys for {n} messages")
    for i, k in enumerate(keys):
        if not isinstance(k, str):
            raise ConfigurationError(f"key {i} must be a str, got {k!r:.80}")
    return keys


def _write_ids(ids: list[Any], q: int, positions: Any, allocated: Any) -> None:
    """Write the ids queue ``q`` gave a put's groups (``allocated``: ``(first seq, count)``
    per group) at their input ``positions``."""
    for (first_seq, count), pos in zip(allocated, positions):
        if isinstance(pos, range) and pos.step == 1:
            ids[pos.start : pos.stop] = id_range(q, first_seq, count)
        else:
            for k, p in enumerate(pos):
                ids[p] = make_id(q, first_seq + k)


def _listed(ids: list[Any] | None, stored: list[tuple[int, Any, Any]], n: int) -> list[Any]:
    """The ids of a send by input position, None where not stored: ``ids`` as recorded, or,
    for a claim's send that recorded none (see ``Sender._send_all``), listed now from the
    puts ``stored``."""
    if ids is not None:
        return ids
    ids = [None] * n
    for q, positions, allocated in stored:
        _write_ids(ids, q, positions, allocated)
    return ids


def _runs(stored: list[tuple[int, Any, Any]]) -> list[Run] | None:
    """The id runs (see :mod:`daskqueue.sent_ids`) of stored puts ``(queue, positions per
    group, (first seq, count) per group)``; None unless every group's positions are a range."""
    runs = []
    for q, positions, allocated in stored:
        for (first_seq, count), pos in zip(allocated, positions):
            if not (isinstance(pos, range) and pos.step == 1):
                return None
            runs.append((q, first_seq, count, pos.start))
    return merge_runs(runs)


class Sender(PutDelivery):
    """Sends encoded put batches of one pool (its ``table``, ``router`` and ``collector``);
    each put's own way to its queue is :class:`~daskqueue.queue.put_delivery.PutDelivery`'s."""

    def __init__(self, table: QueueTable, router: Router, collector: ResultCollector, *, producer: int = 0) -> None:
        self.table = table
        self.router = router
        self.collector = collector
        #: The producer tag every put carries (0: the pool's owner; see daskqueue.producers).
        self.producer = producer

    def send_keyed(self, keyed: list[tuple[int, PutBatch]], n: int) -> list[int]:
        """Send batches encoded by key (each to its key's queue), in waves; their ids."""
        ids: list[Any] = [None] * n
        for wave in waves(keyed):
            self.send([b for _, b in wave], n=n, queues=[q for q, _ in wave], into=ids)
        return ids

    def keyed(self, keys: list[str], payload_of: Callable[[int], Any], options: Any, *,
              size: int, limit: int, what: str) -> list[tuple[int, PutBatch]]:
        """Encode messages by key, each to its key's queue on the ring."""
        return encode_keyed(keys, self.router.key_queue, payload_of, options, size=size, limit=limit, what=what)

    def send(self, batches: list[PutBatch], *, n: int = 0, claim: MapClaim | None = None,
             queue: int | None = None, queues: list[int] | None = None, into: list[int] | None = None) -> list[int]:
        """See :meth:`_send_all`. With a ``claim``, the queues sent to are *held* (see
        ``ResultCollector.holding``) until every put's answer is read and its claim
        registered: a call may run to its end before its put's answer is read, and its
        outcome must reach the claim, not the pool's results (another caller may take those;
        a ``map`` would then wait forever). No lock is held across the puts' answers: polls
        go on meanwhile, and a send never waits behind a poll.

        A send routed by the pool (round-robin, or to the ``queue`` of its type or its one
        key; not one given its ``queues``, such as a keyed wave) follows the routing as it
        changes: a put to a queue taken out of routing meanwhile (``remove_queue`` from
        another thread) goes where the routing sends it now (the next queue in turn, or the
        queue of its type or key on the ring), also when that queue refused it (closed once
        drained) or was released already; a put it stored moves with its messages."""
        reroute = None if queues is not None else ("next" if queue is None else "route")
        if queues is None:
            queues = self.router.assign(len(batches), queue)
        stored: list[tuple[int, Any, Any]] = []  # (queue, positions, answer) of each put stored
        guard = InterruptGuard()
        try:
            with guard:
                if claim is None:
                    ids = self._send_all(batches, n=n, queues=queues, into=into, reroute=reroute, guard=guard,
                                         stored=stored)
                else:
                    with contextlib.ExitStack() as holds:
                        held = set(queues)
                        holds.enter_context(self.collector.holding(held))

                        def hold(q: int) -> None:  # a put rerouted to a queue not held yet: held before it is sent
                            if q not in held:
                                held.add(q)
                                holds.enter_context(self.collector.holding([q]))

                        ids = self._send_all(batches, n=n, claim=claim, queues=queues, into=into, reroute=reroute,
                                             hold=hold, guard=guard, stored=stored)
                    # (the holds are let go with interrupts deferred: _send_all returns so)
        except BaseException as failure:
            # A Ctrl-C deferred while the send failed with an ordinary error (its holds let
            # go, its failure raised) is raised now, from that error, with its stored_ids.
            guard.raise_owed(failure)
            raise
        if guard.late is not None:  # a Ctrl-C as the send ended: raised now, with what it stored
            try:
                guard.deliver_late()
            except BaseException as interruption:
                interruption.stored_ids = _listed(ids, stored, n)  # type: ignore[attr-defined]
                raise
        return ids

    def _send_all(self, batches: list[PutBatch], *, queues: list[int], guard: InterruptGuard,
                  stored: list[tuple[int, Any, Any]], n: int = 0, claim: MapClaim | None = None,
                  into: list[int] | None = None, reroute: str | None = None,
                  hold: Callable[[int], None] | None = None) -> list[int]:
        """Send every encoded batch (batch ``i`` to ``queues[i]``) concurrently; return the
        ids of the ``n`` messages by input position (with ``claim``, route their results to
        it instead, registered as each put is answered, and fill in the ids only if ``into``
        is given, or, given ``n``, if the send fails: its error's ``stored_ids``; else
        return None).
        Every answer is collected before a failure is raised (see the module
        docstring). A small send without a claim starts the outcome polls of its queues
        as soon as its puts are sent (``ResultCollector.prime``): a ``result`` that follows
        finds its outcome on the way.

        Interrupted (a ``KeyboardInterrupt`` while it encodes or waits, or an error of the
        client's own bookkeeping: ``hold``, ``prime``, a claim), it still reads the answers
        of the puts sent (their messages are stored whether or not the client hears of it;
        a second interrupt stops that, see :func:`~daskqueue.queue.interrupted.read_rest`),
        then raises the interruption with ``stored_ids`` (and ``into``) exact for every put
        whose answer it read: a failed ``map`` drops exactly the outcomes of what was
        stored, and files none in the results. A Ctrl-C that lands while a put's answer is
        recorded, or while the interruption is handled, is deferred to where it splits no
        record (:class:`~daskqueue.queue.interrupted.InterruptGuard`): the pool's put counts
        and ``stored_ids`` agree with what was stored, whenever it comes."""
        sends: list[_Put] = []  # each put sent (or being sent)
        errors: list[tuple[int, BaseException, int]] = []  # (queue, error, messages) of each put failed
        keep_ids = into is not None
        # A claim's ids nobody asked for are listed only if the send fails (a map or a
        # stream's chunk needs them then, to know what was stored; see _listed): a million
        # ints cost a stream's put thread a tenth of its time, and a map's list of n Nones
        # would be thrown away.
        ids: list[Any] | None = into if keep_ids else None if claim is not None else [None] * n
        not_sent = None  # how many puts failed unsent, once every put is sent
        try:
            try:
                self._put_all(batches, queues, reroute, hold, sends, errors)
                not_sent = len(errors)
                if claim is None and sends and n <= PRIME_MAX_MESSAGES:
                    self.collector.prime(s.live[0] for s in sends if s.live is not None)
                for send in sends:
                    self._read(send, reroute, hold, stored, errors, ids, claim, keep_ids, guard)
                # What follows (and the caller's letting go of its holds) defers a Ctrl-C: the
                # send is whole, and one that came meanwhile is raised with its ids (see send).
                guard.deferring = True
            except BaseException:
                # Deferred before the handling below starts: an ordinary error arrives with
                # interrupts not deferred, and a Ctrl-C landing here is caught below as the
                # interruption (an interrupt through the guard has set the flag already).
                guard.deferring = True
                raise
        except BaseException as interruption:
            # From here on a Ctrl-C is deferred, but where a put's answer is awaited:
            # whatever it stops, what is raised has its stored_ids.
            # Each put read is in ``stored`` or ``errors`` (none is read before all are sent).
            read = 0 if not_sent is None else len(stored) + len(errors) - not_sent

            def read_again(send: _Put, deadline: float) -> None:
                self._read(send, None, None, stored, rest_errors, ids, claim, keep_ids, guard, deadline)

            rest_errors: list[tuple[int, BaseException, int]] = []
            read_rest(read_again, sends[read:], guard, INTERRUPTED_READ_S, rest_errors,
                      lambda send: send.live[0] if send.live else -1)
            interruption.stored_ids = _listed(ids, stored, n)  # type: ignore[attr-defined]
            raise
        if errors:
            raise self._failure(errors, _listed(ids, stored, n))
        if claim is None and into is None and n >= self.collector.sent_ids.min_ids:
            runs = _runs(stored)
            if runs is not None:  # as_completed(ids) may take them without a check per id
                self.collector.sent_ids.remember(ids, runs)  # type: ignore[arg-type]
        return ids  # type: ignore[return-value]

    def _put_all(self, batches: list[PutBatch], queues: list[int], reroute: str | None,
                 hold: Callable[[int], None] | None, sends: list[_Put],
                 errors: list[tuple[int, BaseException, int]]) -> None:
        """Put every batch (:meth:`_put_routed`), noting each put in ``sends`` before it goes
        out (an interruption finds it there) and each failure (a put not sent) in
        ``errors``, as it happens."""
        for q, batch in zip(queues, batches):
            put = _Put(batch)
            sends.append(put)
            try:
                self._put_routed(q, put, reroute, hold)
            except Exception as e:  # not sent: its messages are not stored
                sends.pop()
                errors.append((q, e, sum(g.count for g in batch[0])))

    def _read(self, send: _Put, reroute: str | None, hold: Callable[[int], None] | None,
              stored: list[tuple[int, Any, Any]], errors: list[tuple[int, BaseException, int]],
              ids: list[Any] | None, claim: MapClaim | None, keep_ids: bool, guard: InterruptGuard,
              deadline: float | None = None) -> None:
        """Read a put's answer (by monotonic ``deadline``, default: each wait's own): record
        what it stored (:meth:`_stored`, then ``stored`` and the pool's counts, with
        interrupts deferred by ``guard``: a Ctrl-C is raised before the record or after it
        is whole), or its failure in ``errors``. A put never sent (interrupted before)
        stored nothing."""
        if send.live is None:
            return
        q = send.live[0]
        groups, _, positions = send.batch
        try:
            q, allocated = self._answer_routed(send, reroute, hold, deadline)
        except Exception as e:
            errors.append((q, e, sum(g.count for g in groups)))
            return
        guard.deferring = True
        # An error of the bookkeeping before ``stored`` has the put read again (its ids and
        # claims are written again as they were); once in ``stored``, it is counted too.
        self._stored(q, groups, positions, allocated, ids, claim, keep_ids)
        stored.append((q, positions, allocated))
        self.table.put_counts[q] += sum(g.count for g in groups)
        self.table.sent_funcs[q].update(g.digest for g in groups if g.digest is not None)
        guard.resume()

    def _stored(self, q: int, groups: Any, positions: Any, allocated: Any, ids: list[Any] | None,
                claim: MapClaim | None, keep_ids: bool = False) -> None:
        """Queue ``q`` stored a batch: record its ids (or its claim, and its ids too with
        ``keep_ids``); done again for the same answer, it changes nothing more (the caller
        counts the put once this is done)."""
        if claim is not None:
            for (first_seq, count), pos in zip(allocated, positions):
                for run_seq, run_count, run_pos in consecutive_runs(first_seq, pos):
                    self.collector.claim(q, run_seq, run_count, claim, run_pos)
        if claim is None or keep_ids:
            _write_ids(ids, q, positions, allocated)  # type: ignore[arg-type]

    def _failure(self, errors: list[tuple[int, BaseException, int]], ids: list[Any]) -> BaseException:
        """The error of a submission that failed part-way: the first one, with the ids of
        what was stored; a lost transient queue's count includes every failed put to it."""
        q, error, _ = errors[0]
        for other_q, other, _ in errors[1:]:
            logger.warning("put to queue %d failed too: %s: %s", other_q, type(other).__name__, other)
        if isinstance(error, QueueLostError) and not isinstance(error, QueueMovedError):
            unsent = sum(count for eq, _, count in errors if eq == q)
            lost = self.table.lost_error(q, unsent=unsent)
            lost.__cause__ = error.__cause__ or error
            error = lost
        error.stored_ids = ids  # type: ignore[attr-defined]
        return error

