"""The consumer actors of a ``ConsumerPool``: placing them on workers, and following the
cluster (membership thread): a default pool keeps one consumer on every worker as workers
join and leave; a pool of a fixed size re-places a consumer lost with its worker at once, on
the least busy surviving worker. The user's thread only reads a snapshot, under ``lock``.

A pool may have no consumer for a while: made before any worker joined, or after ``adapt``
retired the last one (its consumers settled and went). The consumers start on the workers
that join: one per worker, or a fixed pool's ``target`` number. A consumer starts once the
queue pool's queues are placed there (bounded), so that its first calls find them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import cloudpickle
from distributed import Client

from daskqueue import defaults
from daskqueue.queue.gone_workers import LOSS_ASK_TIMEOUT_S, LOSS_CHECK_S, TIMEOUTS, ask_alive, caller
from daskqueue.queue.handles import call_all, free_actor, queue_ref
from daskqueue.scheduler_query import scheduler_workers

__all__ = ["Members", "LOSS_CHECK_S", "LOSS_ASK_TIMEOUT_S"]

logger = logging.getLogger("daskqueue")


@dataclass(eq=False)
class _Member:
    """One consumer actor: its index (home: the pool's ``index``-th queue, in turn), future and handle."""

    index: int
    future: Any
    handle: Any

    @property
    def address(self) -> str:
        return self.handle._address


class Members:
    """The consumer actors of one pool (see the module docstring). ``started`` and
    ``closed`` mirror the pool's: a consumer that joins later starts if the pool is."""

    def __init__(self, client: Client, queue_pool: Any, consumer_class: type, options: dict[str, Any], *,
                 isolation: str, per_worker: bool) -> None:
        self.client = client
        self.queue_pool = queue_pool
        self.consumer_class = consumer_class
        self._options = options
        self.isolation = isolation
        self.per_worker = per_worker
        self.lock = threading.RLock()
        self.members: list[_Member] = []
        self._next_index = 0
        self.started = False
        self.closed = False
        self.replaced = 0  # consumers re-placed after their worker left or retired
        self.target: int | None = None  # a fixed pool's size (None: one per worker)

    def live(self) -> list[_Member]:
        """The consumers not known to be lost (Dask's view; membership may be a moment behind)."""
        with self.lock:
            return [m for m in self.members if m.future.status == "finished"]

    def call_all(self, method: str) -> list[str]:
        """``method()`` on every live consumer, as :meth:`ask_all`, within ``STOP_TIMEOUT_S``;
        return the failures, as text (a lost consumer must not stop the others)."""
        _, failed = self.ask_all(self.live(), method, timeout_s=defaults.STOP_TIMEOUT_S)
        return failed

    def close_all(self) -> list[str]:
        """Close every live consumer (as :meth:`call_all`), then release every consumer
        actor's future: the pool's actors then hold no worker (``adapt`` may retire it)."""
        failed = self.call_all("close")
        with self.lock:
            members = list(self.members)
        for m in members:
            free_actor(m.future, m.handle)
        return failed

    def ask_all(self, members: list[_Member], method: str, *args: Any, timeout_s: float,
                look_first: bool = True,
                args_of: Callable[[_Member], tuple[Any, ...]] | None = None) -> tuple[dict[int, Any], list[str]]:
        """``method(*args)`` (or ``method(*args_of(member))``) of every one of ``members``,
        concurrently, within one deadline of ``timeout_s``; return the answers by consumer
        index, and the failures, as text.

        A consumer whose worker the scheduler no longer has is not waited for, and the
        others are told (``workers_lost``): their calls to queues there end at once, where a
        ``stop`` or ``close`` would wait them out (``REMOTE_CALL_TIMEOUT_S``, 20 s), and the
        call to a dead consumer never ends before the deadline. The pool's membership thread
        may not have told them yet. The scheduler is asked first (with ``look_first``) and
        every ``LOSS_CHECK_S`` while an answer is awaited; one that does not answer leaves
        the wait bounded by ``timeout_s``. Such a consumer is logged, not a failure (the
        pool replaces or forgets it when it hears of the loss), also when its call failed
        at once (the worker had just died, and the scheduler says so after)."""
        deadline = time.monotonic() + timeout_s
        gone: set[str] = set()
        looking = True  # until the scheduler does not answer: then the deadline alone bounds the wait
        if look_first:
            found = self._without_lost(members, gone)
            members, looking = members if found is None else found, found is not None
        calls = [(m.index, _name(m), m.address, caller(m.handle, method, args if args_of is None else args_of(m)))
                 for m in members]
        return ask_alive(calls, method, deadline=deadline, timeout_s=timeout_s, gone=gone, looking=looking,
                         look=lambda addresses: self._look(addresses, gone))

    def _without_lost(self, members: list[_Member], gone: set[str]) -> list[_Member] | None:
        """``members`` but those whose worker the scheduler no longer has (None: it did not
        answer); see :meth:`_look`."""
        if not self._look([m.address for m in members], gone):
            return None
        for m in members:
            if m.address in gone:
                logger.info("consumer %d: its worker %s is gone; not waited for", m.index, m.address)
        return [m for m in members if m.address not in gone]

    def _look(self, addresses: list[str], gone: set[str]) -> bool:
        """Add to ``gone`` those of ``addresses`` (and of the queues' workers) the scheduler no
        longer has, and tell the other consumers of the pool of workers newly found gone;
        whether the scheduler answered."""
        alive = self._scheduler_workers()
        if alive is None:
            return False
        places = set(addresses) | {r[1] for r in self.queue_pool.queue_refs() if r is not None}
        new = {a for a in places if a and a not in alive and a not in gone}
        if not new:
            return True
        gone |= new
        with self.lock:
            told = [m for m in self.members if m.address not in gone and m.future.status == "finished"]
        for m in told:
            try:  # not awaited: what it ends is what the caller waits for
                m.handle.workers_lost(sorted(gone))
            except Exception as e:
                logger.debug("%s: not told of lost workers: %s: %s", _name(m), type(e).__name__, e)
        return True

    def _scheduler_workers(self) -> set[str] | None:
        """The workers the scheduler has now (None: it did not answer in time)."""
        try:
            return set(scheduler_workers(self.client, timeout_s=LOSS_ASK_TIMEOUT_S))
        except Exception as e:
            logger.debug("the scheduler's workers not read: %s: %s", type(e).__name__, e)
            return None

    def spawn(self, worker: str, *, strict: bool) -> tuple[int, Any]:
        """Submit a consumer actor for ``worker`` (only there if ``strict``); its index and future."""
        index, self._next_index = self._next_index, self._next_index + 1
        options = dict(self._options, isolation=self.isolation, child_spec=self._child_spec(index))
        queues, home = self._queue_refs(index)
        future = self.client.submit(
            self.consumer_class, index, queues, home=home,
            **options, actor=True, pure=False, workers=[worker], allow_other_workers=not strict,
        )
        return index, future

    def _child_spec(self, index: int) -> bytes | None:
        """What builds consumer ``index``'s twin in a child process (None: threads only)."""
        if self.isolation == "thread":
            return None
        queues, home = self._queue_refs(index)
        kwargs = dict(self._options, home=home, isolation="thread")
        try:
            return cloudpickle.dumps((self.consumer_class, (index, [None] * len(queues)), kwargs))
        except Exception as e:
            logger.warning("%s cannot be pickled for a child process (%s); its consumers run "
                           "batches on threads", self.consumer_class.__name__, e)
            return None

    def await_member(self, index: int, future: Any) -> _Member:
        try:
            handle = future.result(timeout=defaults.ACTOR_START_TIMEOUT_S)
        except BaseException:
            future.release()
            raise
        return self._member(index, future, handle)

    def await_members(self, spawned: list[tuple[str, bool, int, Any]]) -> list[_Member]:
        """The consumers just submitted (``(worker, strict, index, future)``), once started,
        within one ``ACTOR_START_TIMEOUT_S``. One bound to a worker (``strict``) that the
        scheduler no longer has is released, not waited for: it would never start, and the
        pool's view of the cluster may be a moment behind the scheduler's (the scheduler is
        asked every ``LOSS_CHECK_S``). Any other failure releases them all and is raised."""
        deadline = time.monotonic() + defaults.ACTOR_START_TIMEOUT_S
        pending = {index: (worker, strict, future) for worker, strict, index, future in spawned}
        started: list[_Member] = []
        next_look = time.monotonic() + LOSS_CHECK_S
        try:
            while pending:
                now = time.monotonic()
                if now >= next_look:
                    self._drop_unplaceable(pending)
                    next_look = time.monotonic() + LOSS_CHECK_S
                    continue
                index, (_, _, future) = next(iter(pending.items()))
                try:
                    handle = future.result(timeout=max(0.001, min(next_look, deadline) - now))
                except TIMEOUTS:
                    if time.monotonic() < deadline:
                        continue  # not started yet: look whether its worker is still there
                    raise
                del pending[index]
                started.append(self._member(index, future, handle))
        except BaseException:
            for _, _, future in pending.values():
                future.release()
            for m in started:
                free_actor(m.future, m.handle)
            raise
        return sorted(started, key=lambda m: m.index)

    def _drop_unplaceable(self, pending: dict[int, tuple[str, bool, Any]]) -> None:
        """Release the consumers of ``pending`` bound to a worker the scheduler no longer has."""
        alive = self._scheduler_workers()
        if alive is None:
            return
        for index, (worker, strict, future) in list(pending.items()):
            if strict and worker not in alive and future.status != "finished":
                logger.info("consumer %d not started: its worker %s is gone", index, worker)
                future.release()
                del pending[index]

    def _member(self, index: int, future: Any, handle: Any) -> _Member:
        from daskqueue.queue.actor_handles import bound_to  # imports Dask: the client's side only

        bound_to(handle, self.client)
        return _Member(index, future, handle)

    def add(self, worker: str, *, strict: bool) -> None:
        """Start one more consumer for ``worker`` (started if the pool is); log a failure."""
        self._await_queues()
        index, future = self.spawn(worker, strict=strict)
        try:
            member = self.await_member(index, future)
            dead = self.queue_pool.lost_addresses()
            if dead:  # it must not spend its calls on queues already known lost
                member.handle.workers_lost(dead).result(timeout=defaults.CONTROL_CALL_TIMEOUT_S)
            if self.started:
                member.handle.start().result(timeout=defaults.ACTOR_START_TIMEOUT_S)
        except Exception as e:
            logger.warning("could not start consumer %d on %s: %s", index, worker, e)
            future.release()
            return
        with self.lock:
            self.members.append(member)
        if self.closed:  # closed while it started: close it too
            call_all([(f"consumer {index}", member.handle)], "close", timeout_s=defaults.STOP_TIMEOUT_S)

    def _await_queues(self) -> None:
        """Wait (at most ``CONTROL_CALL_TIMEOUT_S``) while queues of the queue pool have no
        actor: a worker joined, and they are starting on it (a consumer made now would be
        told their places only once they are)."""
        deadline = time.monotonic() + defaults.CONTROL_CALL_TIMEOUT_S
        while self.queue_pool.table.resting and not self.queue_pool.closed and time.monotonic() < deadline:
            time.sleep(defaults.POLL_INTERVAL_S)

    def _least_busy_worker(self, workers: set[str]) -> str | None:
        with self.lock:
            load = {w: 0 for w in workers}
            for m in self.members:
                if m.address in load:
                    load[m.address] += 1
        return min(sorted(load), key=load.__getitem__) if load else None

    def on_membership(self, joined: set[str], left: set[str], retiring: set[str], membership: Any) -> None:
        """Workers joined, left or are retiring: consumers on retiring workers settle what
        they hold and go; forget consumers lost with theirs (their leases were taken back by
        the queue pool), tell the others, and keep the pool at strength."""
        going = self.let_go(retiring)
        with self.lock:
            lost = [m for m in self.members if m.address in left]
            self.members = [m for m in self.members if m.address not in left]
            alive = list(self.members)
        if left:
            self.tell(alive, "workers_lost", sorted(left))
        for m in lost:
            logger.warning("consumer %d was lost with its worker %s", m.index, m.address)
            m.future.release()
        if self.per_worker:
            for worker in sorted(joined - membership.retiring):
                self.add(worker, strict=True)
        else:
            for _ in lost + going:
                worker = self._least_busy_worker(set(membership.placeable()))
                if worker is not None:
                    self.add(worker, strict=False)
                    self.replaced += 1
            self._top_up(membership)

    def _top_up(self, membership: Any) -> None:
        """A fixed pool that has fewer consumers than its ``target`` (none could be placed
        when it was made, or when its last worker retired) places the rest now."""
        missing = (self.target or 0) - len(self.members)
        for _ in range(max(0, missing)):
            worker = self._least_busy_worker(set(membership.placeable()))
            if worker is None or self.closed:
                return
            self.add(worker, strict=False)

    def let_go(self, retiring: set[str]) -> list[_Member]:
        """Consumers on retiring workers: stop (running items finish, fetched ones go back to
        their queues, every lease is settled) and close, within ``RETIRE_STOP_TIMEOUT_S``,
        then free the actors so that Dask may retire their workers. A consumer that is not
        done by then is freed anyway: its unsettled leases are taken back when its worker
        leaves. Returns them (the queue pool calls this first, before its queues move)."""
        with self.lock:
            members = [m for m in self.members if m.address in retiring]
            self.members = [m for m in self.members if m.address not in retiring]
        if not members:
            return []
        targets = [(f"consumer {m.index} on {m.address}", m.handle) for m in members]
        failed = call_all(targets, "close", timeout_s=defaults.RETIRE_STOP_TIMEOUT_S)
        if failed:
            logger.warning("consumers on retiring workers did not settle in time: %s", failed)
        for m in members:
            logger.info("consumer %d left its retiring worker %s", m.index, m.address)
            free_actor(m.future, m.handle)
        return members

    def _queue_refs(self, index: int) -> tuple[list[Any], int]:
        """What consumer ``index`` calls: the queue pool's queues (``queue_ref`` tuples by
        queue index, None for a removed one: never the handles, see WorkerActor) and its home
        queue, the pool's routing queues taken in turn."""
        refs, homes = self.queue_pool.queue_refs(), self.queue_pool.homes
        return refs, homes[index % len(homes)]

    def queues_changed(self) -> None:
        """The queue pool added or removed queues: every consumer fetches from the new set,
        and takes a home among them in turn (all told at once, within one deadline)."""
        def args_of(m: _Member) -> tuple[Any, ...]:
            refs, home = self._queue_refs(m.index)
            return {i: r for i, r in enumerate(refs) if r is not None}, home

        self.tell(self.live(), "set_queues", args_of=args_of)

    def queue_moved(self, queue_index: int, handle: Any) -> None:
        """A durable queue was reopened elsewhere: every consumer calls it there from now on."""
        self.tell(self.live(), "set_queue", queue_index, queue_ref(handle))

    def tell(self, members: list[_Member], method: str, *args: Any,
             args_of: Callable[[_Member], tuple[Any, ...]] | None = None) -> None:
        """``method`` of ``members`` as :meth:`ask_all`, within ``CONTROL_CALL_TIMEOUT_S``
        (a consumer found lost is not waited for); log the failures."""
        _, failed = self.ask_all(members, method, *args, timeout_s=defaults.CONTROL_CALL_TIMEOUT_S,
                                 look_first=False, args_of=args_of)
        if failed:
            logger.warning("%s failed: %s", method, failed)


def _name(m: _Member) -> str:
    return f"consumer {m.index} on {m.address}"
