"""Changing the number of queues of a pool: ``add_queues`` and ``remove_queue``.

Keys (and, in a typed pool, types) move on the ring: only those on the arcs that change
hands move, with their waiting messages, in put order. Moved messages keep their ids: the
result collector reports their outcomes under the old ones.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from daskqueue import defaults, registry
from daskqueue.errors import (
    ConfigurationError,
    JoinTimeoutError,
    QueueCallTimeoutError,
    QueueLostError,
    QueueMovedError,
)
from daskqueue.messages import MAX_QUEUES
from daskqueue.queue.actors import start_actors
from daskqueue.queue.attached_follow import FOLLOW_S
from daskqueue.queue.directory import record_removed
from daskqueue.queue.handles import LOST_CHECK_S, DirectActor, call_all, direct_handles, free_actor
from daskqueue.validate import check_number

__all__ = ["add_queues", "remove_queue", "take_out", "forward_records"]

logger = logging.getLogger("daskqueue")


def add_queues(pool: Any, k: int) -> list[int]:
    """Add ``k`` queues to ``pool`` (see ``QueuePool.add_queues``); their indices."""
    table = pool.table
    check_number("k", k, integer=True, at_least=1, at_most=MAX_QUEUES - len(table.handles))
    old = len(table.handles)
    new = list(range(old, old + k))
    previous = pool.config
    pool.config = dataclasses.replace(previous, n_queues=old + k)
    try:
        queue_class, queue_args = pool.actor_args()
        busy = {h._address for i, h in enumerate(table.handles) if i not in table.removed}
        workers = pool.membership.placeable()
        free = [w for w in workers if w not in busy] or workers
        handles, futures = start_actors(pool.client, queue_class, [queue_args[q] for q in new], pool.queue_kwargs(),
                                        [free[j % len(free)] for j in range(k)], spread=len(free) >= k)
    except BaseException:
        pool.config = previous
        raise
    table.grow(direct_handles(handles, client=pool.client, direct=isinstance(table.handles[0], DirectActor)), futures)
    pool.collector.add_queues(k)
    pool.follower.share_peers()
    nodes = pool.router.targets + new
    for cp in pool.consumer_pools():
        cp.on_queues_changed()
    moved = move_from(pool, [q for q in pool.router.targets if q not in table.lost], nodes, everything=False)
    pool.router.route_to(nodes)
    registry.register_pool(pool)
    logger.info("%r: added queues %s; %d waiting messages moved to them", pool, new, moved)
    return new


def remove_queue(pool: Any, index: int, timeout_s: float | None) -> int:
    """Take queue ``index`` out of ``pool`` (see ``QueuePool.remove_queue``); how many of
    its messages moved.

    Attached producers are told through the registry at once (it lists the queue as
    draining) and, if a queue heard of one lately (``attached_producers``), get at least
    ``FOLLOW_S`` to stop putting there before it closes; a put that still comes
    is moved too (the queue closes only while it holds nothing, see ``close_if_drained``).
    Their records not fetched go to another queue before it closes (``forward_records``),
    where they read them: their outcomes and where their messages moved (the queue closes
    only once none is left to hand on)."""
    table = pool.table
    check_number("index", index, integer=True, at_least=0)
    if index >= len(table.handles) or index in table.removed:
        raise ConfigurationError(f"{pool!r} has no queue {index} (its queues: {pool.queue_indices})")
    if index in table.lost:
        raise table.lost_error(index)
    nodes = [q for q in pool.router.targets if q != index]
    if not nodes:
        raise ConfigurationError(f"queue {index} is the last queue of {pool!r}: close the pool instead")
    pool.router.route_to(nodes)
    registry.register_pool(pool)  # attached handles stop routing to it (they read it within FOLLOW_S)
    grace_until = time.monotonic() + (FOLLOW_S + defaults.MOVE_POLL_S if _any_attached(pool) else 0.0)
    for cp in pool.consumer_pools():
        cp.on_queues_changed()  # homes move off it; it is still served until it is drained
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    moved = 0
    while True:
        moved += move_from(pool, [index], nodes, everything=True)
        s = table.ask(index, "stats", deadline=_call_deadline(deadline))
        if s.pending == 0 and time.monotonic() >= grace_until and not _consumers_hold(pool, index):
            # Every outcome it holds, before it goes (drained: no more come; fetched until an
            # answer is applied that shows none beyond the cursors, see ``fetch_all``).
            pool.collector.fetch_all(index, _call_deadline(deadline))
            forward_records(pool, index, nodes)  # and every attached producer's, to a queue it reads
            # Marked removed before it closes: the owner's polls (other threads: a map, an
            # executor, a join) stop asking it, and one already sent that finds it closed
            # counts as empty (QueueClosedError would end an executor or fail a map).
            pool.collector.removed.add(index)
            try:
                closed = table.ask(index, "close_if_drained", deadline=_call_deadline(deadline))
            except BaseException:
                pool.collector.removed.discard(index)
                raise
            if closed:
                # Its last outcomes: an owner's put sent before the routing changed may have
                # come after the last move, and run and been acked before the close.
                try:
                    pool.collector.fetch_all(index, _call_deadline(deadline), closed=True)
                except Exception as e:  # the removal stands (the queue is closed): say what may be lost
                    logger.warning("%r: queue %d closed, but its last outcomes were not read: %s: %s",
                                   pool, index, type(e).__name__, e)
                break
            # An attached producer's put came meanwhile (move it too), or the record of one that
            # ran since its records were handed on (hand it on too).
            pool.collector.removed.discard(index)
        if deadline is not None and time.monotonic() > deadline:
            raise JoinTimeoutError(timeout_s or 0.0, {"ready": s.ready, "delayed": s.delayed, "leased": s.leased})
        table.check_scheduler()
        time.sleep(defaults.MOVE_POLL_S)
    # Registered as removed before its actor is released: an attached handle whose call then
    # fails as if the worker died finds it removed, not lost.
    table.removed.add(index)
    registry.register_pool(pool)
    take_out(pool, index)
    if pool.durability == "durable":
        record_removed(pool.dirpath, index)
    pool.follower.share_peers()
    registry.register_pool(pool)
    for cp in pool.consumer_pools():
        cp.on_queues_changed()
    logger.info("%r: queue %d removed; %d of its messages moved to the others", pool, index, moved)
    return moved


def _consumers_hold(pool: Any, index: int) -> bool:
    """Whether an ``early_ack`` consumer of ``pool`` may still hold a batch it fetched from
    queue ``index``: such a batch is settled (not pending) but its outcomes reach the queue
    only after it ran, so closing the queue before would lose them. (A late-acked batch is
    leased: ``pending`` already counts it.) A live consumer that does not answer ``stats``
    counts as holding one; one whose worker died is no longer live (its early-acked tasks
    are lost with it, as that option says). Each call is bounded (``ConsumerPool.stats``)."""
    for cp in pool.consumer_pools():
        if not getattr(cp, "early_ack", False):
            continue
        live = len(cp.members.live())
        stats = cp.stats()
        if len(stats) < live or any(index in s.inflight_queues for s in stats):
            return True
    return False


def _any_attached(pool: Any) -> bool:
    """Whether a queue of ``pool`` heard of an attached producer lately (asked at once,
    bounded; a queue that does not answer counts as yes)."""
    table = pool.table
    deadline = time.monotonic() + defaults.CONTROL_CALL_TIMEOUT_S
    calls = []
    for q, _ in table.in_service():
        try:
            calls.append((q, table.call(q, "attached_producers")))
        except Exception:  # unreachable now: assume it has some
            return True
    for q, pending in calls:
        try:
            if table.answer(q, pending, deadline):
                return True
        except Exception as e:
            logger.debug("queue %d: attached producers not asked: %s", q, e)
            return True
    return False


def _call_deadline(deadline: float | None) -> float | None:
    """A call's deadline within a wait until ``deadline``: a call made at the deadline still
    gets a moment to answer (the wait's own timeout is reported, with counts, after it)."""
    return None if deadline is None else max(deadline, time.monotonic() + LOST_CHECK_S)


def forward_records(pool: Any, q: int, nodes: list[int]) -> int:
    """Drained queue ``q`` hands the records its attached producers have not fetched (their
    outcomes, and moved records) to one of the queues ``nodes``, where they read them; each
    destination is tried in turn (bounded calls), in rounds, for up to ``MOVE_WAIT_S``.
    Returns how many records went. If no queue took them, raises
    :class:`QueueCallTimeoutError`: the removal stops with queue ``q`` still open (nothing
    is closed away; ``remove_queue`` can be called again)."""
    table = pool.table
    started = time.monotonic()
    errors: list[str] = []
    while True:
        errors = []
        for dest in [d for d in nodes if d not in table.lost and d not in table.removed]:
            try:
                return int(table.ask(q, "forward_records", dest, deadline=_call_deadline(
                    time.monotonic() + 2 * defaults.CONTROL_CALL_TIMEOUT_S)))
            except Exception as e:  # that destination did not take them (moving, lost): the next may
                errors.append(f"queue {dest}: {type(e).__name__}: {e}")
        if time.monotonic() - started > defaults.MOVE_WAIT_S:
            break
        table.check_scheduler()
        time.sleep(defaults.MOVE_POLL_S)
    logger.warning("%r: queue %d's records of attached producers were not handed on (%s); "
                   "the queue stays open", pool, q, "; ".join(errors) or "no queue to take them")
    raise QueueCallTimeoutError(q, "forward_records", round(time.monotonic() - started, 3))


def take_out(pool: Any, q: int) -> None:
    """Queue ``q`` is drained: close its actor and forget it (its index stays taken)."""
    table = pool.table
    if table.futures[q] is not None and q not in table.resting:  # else it has no actor to close
        failed = call_all([(f"queue {q}", table.handles[q])], "close", timeout_s=defaults.STOP_TIMEOUT_S)
        if failed:
            logger.warning("closing removed queue %d failed: %s", q, failed)
        free_actor(table.futures[q], table.handles[q])
    table.removed.add(q)
    pool.collector.removed.add(q)
    pool.router.route_to([i for i in pool.router.targets if i != q])


def move_from(pool: Any, sources: list[int], nodes: list[int], *, everything: bool) -> int:
    """Have queues ``sources`` hand the messages the ring of ``nodes`` routes elsewhere to
    their queues (all of them with ``everything``); record the moves so that their outcomes
    come back under their old ids; return how many moved. A destination that did not
    answer is asked again (the move is idempotent); still failing, raises
    :class:`QueueLostError` for that source.

    A call to one source that fails (not sent, or no answer) raises its error, but only once
    every call already sent is answered and its moves recorded (within one
    ``CALL_TIMEOUT_S`` for them all, but for a source asked again where it moved, which gets
    a ``CALL_TIMEOUT_S`` of its own): a source that moved messages while another failed has
    them accounted for, or a map waiting on them would wait for good. So does a Ctrl-C while
    an answer is awaited: it is raised once the others are read."""
    table, typed = pool.table, pool.router.typed
    total = 0
    for _ in range(defaults.PUT_ATTEMPTS):
        retry = []
        error: Exception | None = None
        interrupt: BaseException | None = None
        # The destinations' outcomes are held until the moves are recorded: a moved message
        # may run there, and its outcome be polled under its new id, before move_out's
        # answer is read; filed then, it would reach no claim (a map would wait for good).
        with pool.collector.holding(nodes):
            calls = []
            for q in sources:
                try:
                    calls.append((q, table.call(q, "move_out", nodes, typed, everything)))
                except Exception as e:  # not sent: nothing moved from q; no other is asked
                    error = e
                    break
            deadline = time.monotonic() + defaults.CALL_TIMEOUT_S
            for q, pending in calls:
                try:
                    runs, failed = _move_answer(table, q, pending, deadline)
                except Exception as e:  # what it moved, if anything, is unknown here
                    logger.warning("%r: queue %d did not answer moving its messages: %s: %s",
                                   pool, q, type(e).__name__, e)
                    error = error or e
                    continue
                except BaseException as e:  # a Ctrl-C: raised once the other answers are read
                    interrupt = interrupt or e
                    continue
                total += _record_moves(pool, q, runs)
                if failed:
                    logger.warning("queue %d: moving messages failed (%s); trying again", q, "; ".join(failed))
                    retry.append(q)
        if interrupt is not None:
            raise interrupt
        if error is not None:
            raise error
        if not retry:
            return total
        sources = retry
    raise QueueLostError(sources[0], table.handles[sources[0]]._address, pool.durability)


def _move_answer(table: Any, q: int, pending: Any, deadline: float) -> Any:
    """``move_out``'s answer from queue ``q`` by ``deadline``; if ``q`` moved meanwhile, asked
    again where it moved (the move is idempotent), with a ``CALL_TIMEOUT_S`` of its own at
    least: the shared deadline may be spent already by a slower source read before it, and
    that call would time out though the move happened (its moves then unrecorded)."""
    try:
        return table.answer(q, pending, deadline)
    except QueueMovedError:
        again = table.call(q, pending.method, *pending.args)
        return table.answer(q, again, max(deadline, time.monotonic() + defaults.CALL_TIMEOUT_S))


def _record_moves(pool: Any, q: int, runs: list[tuple[int, int, int, int]]) -> int:
    """Record the moves ``runs`` of queue ``q`` (``(old first seq, count, new queue, new
    first seq)``): outcomes come back under their old ids, counts follow; how many moved."""
    table = pool.table
    pool.collector.moved(runs, q)
    moved = 0
    for _, count, dest, _ in runs:
        table.put_counts[q] -= count
        table.put_counts[dest] += count
        moved += count
    return moved
