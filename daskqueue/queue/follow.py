"""How a queue pool follows its cluster: the membership thread's reactions.

Workers retire: their queues hand their state to successors elsewhere (two-phase: the old
actor stops serving provisionally, ``handoff_done`` makes it final once the successor is
installed, ``handoff_abort`` resumes it when no successor could be). Workers left: their
queues are lost (a durable one is reopened elsewhere), every other queue takes back the
leases of the consumers that were there. No worker can take a queue now: a durable one
waits for one to join, a handed-off state is parked in the client.

A queue with no actor is *resting* (``table.resting``): a pool made before any worker joined,
or one whose last worker ``adapt`` retired while it was idle (its queues' states parked here:
a durable queue's is its directory and its live leases, nothing else). A call that needs a
resting queue wakes it (:meth:`Follower.wake`): the pool asks the scheduler for a worker
(:data:`~daskqueue.scheduler_plugin.DEMAND_TOPIC`) and the queue starts on the next one that
joins. A state parked with work in it asks at once; an idle one only when called.

Every wait here is bounded (``defaults.SUCCESSOR_WAIT_S``, ``CONTROL_CALL_TIMEOUT_S``): one
membership thread serves every pool of a client, so a slow reaction must not hold the
others. A successor that starts slower is finished on a later membership event, or by a
call that waits for its queue; one whose workers all left meanwhile is started again
elsewhere (:mod:`~daskqueue.queue.follow_starts`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from daskqueue import defaults, registry
from daskqueue.queue.actors import Unplaced
from daskqueue.queue.demand import Demand
from daskqueue.queue.gone_workers import call_alive, worker_gone
from daskqueue.queue.follow_starts import StartsMixin
from daskqueue.queue.handles import DirectActor, call_all, direct_handles, free_actor
from daskqueue.queue.handoff import handoff_pending
from daskqueue.queue.pool_peers import PoolPeers
from daskqueue.queue.successors import Start, confirm_hand_off

__all__ = ["Follower", "confirm_hand_off"]

logger = logging.getLogger("daskqueue")


class Follower(StartsMixin):
    """The membership reactions of queue pool ``pool`` (its ``table``, ``client``,
    ``membership``, ``actor_spec(q)``, ``consumer_pools()`` and ``closed``)."""

    def __init__(self, pool: Any, *, direct: bool = False) -> None:
        self.pool = pool
        self.table = pool.table
        self.direct = direct  # whether successors of a queue with no actor yet get direct handles
        # Handed-off state waiting for a worker to join (None: a queue that never had an actor).
        self.parked: dict[int, bytes | None] = {}
        self.demand = Demand(pool, self.table.resting)  # resting queues that asked for a worker
        self.awaiting_worker: set[int] = set()  # durable queues to reopen when a worker joins
        self.peers = PoolPeers(self.table)  # what the queues are told of each other and the slots
        self._starting: dict[int, Start] = {}  # successors still starting (see StartsMixin)
        self._bound: dict[int, frozenset[str]] = {}
        self._hand_off_again: set[int] = set()  # hand-offs that failed: tried on the next event
        self._lock = threading.RLock()
        table = self.table
        table.wake = self.wake
        table.while_moving = lambda: self.finish_started(blocking=False)

    # -- resting: queues with no actor ------------------------------------------------------------

    def rest_new(self) -> None:
        """The pool was made before any worker joined: every queue rests until one does, and
        the scheduler is asked for one now (making a pool is asking for work)."""
        with self._lock:
            for q in self.table.indices():
                self._rest(q, None)
            self.want(self.table.indices())

    def _rest(self, q: int, state: bytes | None) -> None:
        """Queue ``q`` has no actor now: it starts on the next worker that joins, from
        ``state`` (or, with none, afresh; a durable queue from its directory)."""
        table = self.table
        if q not in table.moving:
            table.begin_move(q)
        table.resting.add(q)
        if state is None and self.pool.durability == "durable":
            self.awaiting_worker.add(q)
        else:
            self.parked[q] = state

    def wake(self, q: int) -> None:
        """A call needs resting queue ``q``: ask for a worker, and start the resting queues
        at once if one can take them (the call then waits for that, up to ``WORKER_WAIT_S``)."""
        self.want([q])
        if self._lock.acquire(blocking=False):  # else a reaction is at it already
            try:
                self._start_resting()
            finally:
                self._lock.release()

    def _start_resting(self) -> None:
        if self.parked:
            self._unpark()
        for q in sorted(self.awaiting_worker):
            if q in self._starting or not self.placeable_for(q):
                continue
            self.awaiting_worker.discard(q)
            self.reopen(q)

    def want(self, queues: Any) -> None:
        """Ask the scheduler for a worker for those of ``queues`` that rest (see :class:`Demand`)."""
        self.demand.want(queues)

    def close_queues(self) -> list[str]:
        """Close every queue that has an actor (within ``STOP_TIMEOUT_S``; one on a worker the
        scheduler no longer has is not called, see :func:`call_alive`), release every actor
        future the pool holds (so that its workers may retire), drop the parked states and
        the demand for a worker. Returns the failures, as text."""
        with self._lock:
            table = self.table
            gone = set(table.lost) | table.removed | table.resting
            live = [(f"queue {i}", h) for i, h in enumerate(table.handles) if i not in gone]
            failed = call_alive(self.pool.client, live, "close", timeout_s=defaults.STOP_TIMEOUT_S)
            for q, future in enumerate(table.futures):
                if future is not None and q not in table.resting:
                    free_actor(future, table.handles[q])
            for start in self._starting.values():
                start.submitted.done_with_state()
                start.future.release()
            self._starting.clear()
            self.parked.clear()
            self.awaiting_worker.clear()
            self.demand.withdraw(None)
            return failed

    def on_membership(self, joined: set[str], left: set[str], retiring: set[str]) -> None:
        """See the module docstring; consumers on retiring workers settle first, with their
        queues still in place (a queue with nowhere to go waits in the client, where no
        settlement can reach it)."""
        table = self.table
        with self._lock:
            self.finish_started()
            if retiring:
                for cp in self.pool.consumer_pools():
                    cp.on_workers_retiring(retiring)
            still = self.pool.membership.retiring
            again, self._hand_off_again = self._hand_off_again, set()
            for q, handle in enumerate(table.handles):
                if (handle._address in retiring or (q in again and handle._address in still)) \
                        and q not in table.lost and q not in table.moving and q not in table.removed:
                    self.hand_off(q)
            if joined and (self.parked or self.awaiting_worker):
                self._start_resting()
            if left:
                self.restart_stranded()
                self._lost_workers(left)

    def _lost_workers(self, left: set[str]) -> None:
        table, reopen = self.table, []
        for q, handle in enumerate(table.handles):
            if handle._address not in left or q in table.lost or q in table.resting or q in table.removed \
                    or q in self._starting:
                continue
            if self.pool.durability == "durable":
                table.begin_move(q)
                reopen.append(q)
                logger.warning("queue %d of %r was lost with its worker %s; reopening it elsewhere",
                               q, self.pool, handle._address)
            else:
                table.lost[q] = handle._address
                logger.error("queue %d of %r was lost with its worker %s", q, self.pool, handle._address)
        try:
            alive = [(f"queue {q}", h) for q, h in table.in_service()]
            failed = call_all(alive, "workers_lost", sorted(left), timeout_s=defaults.CONTROL_CALL_TIMEOUT_S)
            if failed:
                logger.warning("taking back the leases of lost workers failed: %s", failed)
        finally:  # a queue marked moving must be reopened (or given up), whatever happened
            for q in reopen:
                self.reopen(q)

    def reopen(self, q: int) -> None:
        """Reopen durable queue ``q`` from its directory on a surviving worker and move every
        handle to it. With no worker to take it now, it waits for the next worker to join;
        calls to it wait meanwhile."""
        if not self.placeable_for(q):
            self._rest(q, None)
            registry.register_pool(self.pool)  # says it rests (attached handles wait for it)
            self.want([q])  # it was lost, not let go idle: it may hold work
            logger.warning("queue %d of %r: no worker can take it now; reopening it when one joins", q, self.pool)
            return
        try:
            submitted = self._submit_successor(q)
        except BaseException as e:
            logger.error("queue %d could not be reopened (%s); it stays lost", q, e)
            self._give_up(q)
            return
        self._await_start(q, submitted, None)

    def hand_off(self, q: int) -> None:
        """Move queue ``q`` off its retiring worker (two-phase, see the module docstring).
        Calls made meanwhile wait for the move; calls the old queue refused are made again
        at the successor."""
        table = self.table
        old = table.handles[q]
        table.begin_move(q)
        try:
            state = old.hand_off().result(timeout=defaults.CONTROL_CALL_TIMEOUT_S)
        except Exception as e:  # it may have stopped serving provisionally: resume it
            logger.error("queue %d of %r could not hand off from %s (%s: %s); trying again on the next "
                         "membership event", q, self.pool, old._address, type(e).__name__, e)
            confirm_hand_off(old, "handoff_abort")
            table.end_move(q)
            self._hand_off_again.add(q)
            return
        if not self.placeable_for(q):
            if self._handed_over(q, old):
                self._park(q, state)
            else:
                table.end_move(q)
            return
        started = self._start_now(q, state)
        if started is None or not self._handed_over(q, old):
            # No successor (or the old queue resumed meanwhile): the old queue serves on.
            if started is not None:
                self._discard(q, *started)
            confirm_hand_off(old, "handoff_abort")
            table.end_move(q)
            self._hand_off_again.add(q)
            logger.error("queue %d of %r: no successor took its state; it serves on at %s (trying again on "
                         "the next membership event)", q, self.pool, old._address)
            return
        self.install(q, *started)
        logger.info("queue %d of %r moved from retiring worker %s", q, self.pool, old._address)

    def _handed_over(self, q: int, old: Any) -> bool:
        """Tell queue ``q``'s old actor that its hand-off is final (``handoff_done``); whether
        it is. Also final when the old actor cannot be told because its worker died after
        handing over its state (the scheduler no longer has it): a dead actor serves nothing,
        so the state in hand is the queue's only copy. Before, such a transient queue was
        given up as lost with its worker, though this client held all of it."""
        if confirm_hand_off(old, "handoff_done"):
            return True
        if worker_gone(self.pool.client, old._address):
            logger.warning("queue %d of %r: its old worker %s died after handing over its state; the "
                           "successor takes it", q, self.pool, old._address)
            return True
        return False

    def placeable_for(self, q: int) -> list[str]:
        """Workers a new actor of queue ``q`` may go to, those without a queue first."""
        table = self.table
        busy = {h._address for i, h in enumerate(table.handles)
                if i != q and i not in table.resting and i not in table.removed}
        workers = [w for w in self.pool.membership.placeable() if w != table.handles[q]._address]
        return [w for w in workers if w not in busy] or workers

    def _park(self, q: int, state: bytes) -> None:
        """No other worker can take queue ``q`` now (every worker is retiring): keep its
        handed-off state here, free the old actor so its worker may retire, and start the
        successor on the next worker that joins. Calls to the queue wait meanwhile (and wake
        it); a state with work in it asks the scheduler for a worker at once."""
        self._rest(q, state)
        # Registered as resting before the old actor is freed: attached handles wait for it.
        registry.register_pool(self.pool)
        free_actor(self.table.futures[q], self.table.handles[q])
        pending = handoff_pending(state)
        if pending:
            self.want([q])
        # An idle pool at rest is the normal end of an adaptive cluster's work: no warning.
        logger.log(logging.WARNING if pending else logging.INFO,
                   "queue %d of %r: no worker can take it now; its state (%d messages unsettled) waits "
                   "in the client for the next worker to join", q, self.pool, pending)

    def _unpark(self) -> None:
        """Workers joined: start the parked queues there."""
        for q in sorted(self.parked):
            if q in self._starting:
                continue
            if not self.placeable_for(q):
                return
            try:
                submitted = self._submit_successor(q, self.parked[q])
            except BaseException as e:
                logger.warning("queue %d: starting its successor failed (%s: %s); it waits for "
                               "another worker", q, type(e).__name__, e)
                continue
            self._await_start(q, submitted, self.parked.pop(q))

    def _give_up(self, q: int) -> None:
        """Queue ``q`` is lost for good (and wants no worker)."""
        self.table.give_up(q)
        self.demand.withdraw(q)

    def _handle_of(self, q: int, handle: Any) -> Any:
        old = self.table.handles[q]
        direct = self.direct if isinstance(old, Unplaced) else isinstance(old, DirectActor)
        return direct_handles([handle], client=self.pool.client, direct=direct)[0]

    def install(self, q: int, handle: Any, future: Any) -> None:
        """Queue ``q`` lives at ``handle`` from now on: route there, point every consumer
        there, and only then free the old actor (its worker may then retire): until told, a
        consumer settles its leases of a handed-off queue at the old actor, which refuses
        them for the consumer to repeat at the successor; gone, a settlement was lost and
        its task ran again (each ``set_queue`` waits at most ``CONTROL_CALL_TIMEOUT_S``)."""
        if self.pool.closed:  # closed meanwhile: the new actor must not keep the directory locked
            self._discard(q, handle, future)
            self._give_up(q)
            return
        resting = q in self.table.resting
        self.table.resting.discard(q)
        old_future, old_handle = self.table.replace(q, handle, future)
        # Registered before the old actor is freed: attached handles find the successor there.
        registry.register_pool(self.pool)
        self.demand.withdraw(q)
        try:
            for cp in self.pool.consumer_pools():
                cp.on_queue_moved(q, handle)
        finally:
            if old_future is not None and not resting:  # a resting queue's old actor was freed already
                free_actor(old_future, old_handle)
        self.share_peers()

    # -- peers and slots (see PoolPeers) --------------------------------------------------------

    def share_peers(self) -> None:
        """Tell every queue where the others are, and the consumers' slots (:meth:`PoolPeers.share`)."""
        self.peers.share()

    def set_slots(self, owner: str, slots: int, *, typed: bool) -> None:
        """Consumer pool ``owner`` runs ``slots`` batches at once (:meth:`PoolPeers.set_slots`)."""
        self.peers.set_slots(owner, slots, typed=typed)
