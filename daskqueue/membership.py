"""Which workers the cluster has, as the scheduler sees it, pushed to the pools; and what
the scheduler learns from the pools.

A :class:`MembershipPlugin` on the scheduler publishes every worker that joins, leaves or is
about to retire on the ``daskqueue-membership`` event topic. On the client, one
:class:`Membership` per client subscribes to it and runs a thread of its own
(``daskqueue-membership``) that reconciles the events with the scheduler's worker list and
calls its listeners, the pools, with the workers that joined, left and are retiring. The
pools therefore follow the cluster with no call from the user, and they do their blocking
work (starting actors, moving queues) on that thread, never on the client's event loop and
never on the user's thread.

The plugin also changes two of the scheduler's handlers, for every caller (``Client``,
``Adaptive``, a worker ending its ``--lifetime``):

* ``retire_workers``: Dask refuses to retire a worker that holds an actor. Before Dask's own
  retirement runs, the plugin publishes ``retiring`` and waits (at most
  :data:`HANDOFF_TIMEOUT_S`) until the pools have moved their actors off those workers: a
  queue hands its whole state to a successor elsewhere, consumers settle and stop.
* ``adaptive_target``: Dask's adaptive scaling sees only scheduler tasks. Queue actors report
  their backlog on ``daskqueue-load`` every second while they have work; the target becomes
  the larger of Dask's and the workers the queued work needs (see :func:`queue_target`).

Listeners are held weakly: a pool that is garbage collected stops listening. A listener's
``on_membership(joined, left, retiring)`` must not raise; what it raises is logged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
import weakref
from typing import Any, Protocol

from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["MembershipPlugin", "Membership", "membership", "queue_target", "TOPIC", "LOAD_TOPIC"]

logger = logging.getLogger("daskqueue")

#: The scheduler event topic on which the plugin publishes joins, leaves and retirements.
TOPIC = "daskqueue-membership"

#: The topic on which queue actors report their backlog to the scheduler.
LOAD_TOPIC = "daskqueue-load"

#: How long ``close`` waits for the thread (a listener call it is in must finish first).
CLOSE_TIMEOUT_S = 30.0

#: How long the thread waits before it tries again after reading the worker list failed.
RETRY_S = 1.0

#: How long a retirement waits for the pools to move their actors off the retiring workers
#: before Dask's own retirement runs (which refuses a worker that still holds an actor).
HANDOFF_TIMEOUT_S = 20.0

#: A queue's load report older than this is not counted (its queue stopped reporting).
LOAD_STALE_S = 10.0

#: How long the client may be reconnecting to its scheduler before the pools call the
#: scheduler lost (its workers, and the actors on them, close when it is gone).
SCHEDULER_LOST_S = 5.0


def queue_target(loads: list[dict[str, Any]], *, target_duration_s: float, unknown_task_s: float,
                 threads_per_worker: float) -> int:
    """The workers that the queued work of ``loads`` (queue reports) needs to finish within
    about ``target_duration_s``, the way Dask sizes its own backlog: seconds of work (ready
    and leased messages times the measured seconds per message, ``unknown_task_s`` before any
    is measured) over the target duration, at most one thread per message."""
    work_s = 0.0
    messages = 0
    for load in loads:
        n = load["ready"] + load["leased"]
        work_s += n * (load["task_s"] if load["task_s"] is not None else unknown_task_s)
        messages += n
    if messages == 0:
        return 0
    threads = min(messages, math.ceil(work_s / target_duration_s))
    return math.ceil(threads / max(threads_per_worker, 1e-9))


class MembershipPlugin(SchedulerPlugin):
    """Publishes ``{"action": "join" | "leave" | "retiring", ...}`` on :data:`TOPIC`; makes
    retirement wait for the pools' hand-off and adaptive scaling count the queues' backlog."""

    name = "daskqueue-membership"
    idempotent = True  # one per scheduler, however many pools register it

    def __init__(self) -> None:
        self.loads: dict[tuple[str, int], tuple[float, dict[str, Any]]] = {}
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        handlers = scheduler.handlers
        retire, target = handlers["retire_workers"], handlers["adaptive_target"]

        async def retire_workers(workers: list[str] | None = None, *, names: list[Any] | None = None,
                                 **kwargs: Any) -> Any:
            workers = self._resolve(workers, names, kwargs)
            if workers is None:
                return await retire(names=names, **kwargs)
            await self.hand_off(workers)
            return await retire(workers=workers, **kwargs)

        def adaptive_target(target_duration: Any = None) -> int:
            return max(target(target_duration=target_duration), self.queue_target(target_duration))

        handlers["retire_workers"] = retire_workers
        handlers["adaptive_target"] = adaptive_target

    def add_worker(self, scheduler: Any, worker: str) -> None:
        scheduler.log_event(TOPIC, {"action": "join", "worker": worker})

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str, **kwargs: Any) -> None:
        scheduler.log_event(TOPIC, {"action": "leave", "worker": worker})

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == LOAD_TOPIC and isinstance(msg, dict):
            self.loads[(msg["pool"], msg["queue"])] = (time.monotonic(), msg)

    # -- retirement ---------------------------------------------------------------------------

    def _resolve(self, workers: list[str] | None, names: list[Any] | None,
                 kwargs: dict[str, Any]) -> list[str] | None:
        """The addresses a ``retire_workers`` call names (by address, by name, or chosen by
        ``workers_to_close``, chosen here once so that the hand-off and Dask agree); None if
        the call is malformed (Dask's own handler then says why)."""
        s = self.scheduler
        if workers is not None and names is None:
            return [w for w in workers if w in s.workers]
        if names is not None and workers is None:
            wanted = {str(n) for n in names}
            return [a for a, ws in s.workers.items() if str(ws.name) in wanted]
        if workers is None and names is None:
            return list(s.workers_to_close(**kwargs))
        return None

    async def hand_off(self, workers: list[str]) -> None:
        """Ask the pools to move every actor off ``workers``; return once none holds one, or
        after :data:`HANDOFF_TIMEOUT_S` (Dask's retirement then refuses what still holds one)."""
        s = self.scheduler
        if not any(s.workers[w].actors for w in workers if w in s.workers):
            return
        s.log_event(TOPIC, {"action": "retiring", "workers": list(workers)})
        started = time.monotonic()
        while time.monotonic() < started + HANDOFF_TIMEOUT_S:
            if not any(s.workers[w].actors for w in workers if w in s.workers):
                logger.info("daskqueue: actors moved off retiring workers %s in %.2f s", workers,
                            time.monotonic() - started)
                return
            await asyncio.sleep(0.05)
        held = {w: sorted(str(ts.key) for ts in s.workers[w].actors) for w in workers if w in s.workers}
        logger.warning("daskqueue: actors still on retiring workers after %g s: %s", HANDOFF_TIMEOUT_S, held)

    # -- adaptive scaling ---------------------------------------------------------------------

    def queue_target(self, target_duration: Any = None) -> int:
        """Workers the queues' reported backlog needs (0 with no fresh report)."""
        import dask
        from dask.utils import parse_timedelta

        now = time.monotonic()
        self.loads = {k: v for k, v in self.loads.items() if now - v[0] < LOAD_STALE_S}
        if not self.loads:
            return 0
        s = self.scheduler
        duration = target_duration or dask.config.get("distributed.adaptive.target-duration")
        unknown = dask.config.get("distributed.scheduler.unknown-task-duration")
        nthreads = sum(ws.nthreads for ws in s.workers.values())
        return queue_target(
            [m for _, m in self.loads.values()], target_duration_s=parse_timedelta(duration),
            unknown_task_s=parse_timedelta(unknown),
            threads_per_worker=nthreads / len(s.workers) if s.workers else 1.0,
        )


class Listener(Protocol):
    def on_membership(self, joined: set[str], left: set[str], retiring: set[str]) -> None: ...


class Membership:
    """The workers of one client's cluster, kept current from the scheduler's events.

    ``workers`` is the set of live worker addresses after the last reconciliation;
    ``retiring`` those of them being retired (no new actor goes there). Started by
    :func:`membership`; :meth:`close` stops and joins the thread (also at client close).
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self._events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._listeners: list[weakref.ref[Any]] = []
        self._lock = threading.Lock()
        self._stopped = False
        topic = TOPIC
        try:
            client.register_plugin(MembershipPlugin())
        except Exception as e:  # e.g. daskqueue is not installed where the scheduler runs
            logger.warning("daskqueue: cannot register the membership plugin on the scheduler "
                           "(%s); following the scheduler's 'all' events instead", e)
            topic = "all"
        # Subscribe first, then read the list: a change in between is seen by both, never
        # by neither.
        client.subscribe_topic(topic, self._events.put)
        self.workers: set[str] = self._scheduler_workers()
        self.retiring: set[str] = set()
        self._unreachable_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="daskqueue-membership", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<Membership: {len(self.workers)} workers, {len(self._listeners)} listeners>"

    def placeable(self) -> list[str]:
        """The workers new actors may go to: live and not retiring, sorted."""
        return sorted(self.workers - self.retiring)

    def scheduler_lost(self) -> str | None:
        """The client's status if it has lost its scheduler (closed, or reconnecting for
        more than :data:`SCHEDULER_LOST_S`), else None. Cheap: reads one attribute."""
        status = getattr(self.client.status, "value", self.client.status)
        if status in ("running", "newly-created"):
            self._unreachable_since = None
            return None
        if status in ("closing", "closed"):
            return status
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
        return status if now - self._unreachable_since >= SCHEDULER_LOST_S else None

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(weakref.ref(listener))

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = [r for r in self._listeners if r() not in (None, listener)]

    def close(self) -> None:
        """Stop the thread and wait for it (a listener call it is in finishes first)."""
        self._stopped = True
        self._events.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(CLOSE_TIMEOUT_S)

    # -- the thread -------------------------------------------------------------------------

    def _scheduler_workers(self) -> set[str]:
        info = self.client.scheduler_info(n_workers=-1)
        return set(info["workers"])

    def _run(self) -> None:
        while not self._stopped:
            events = [self._events.get()]
            while True:  # take every event that is already here: one reconciliation
                try:
                    events.append(self._events.get_nowait())
                except queue.Empty:
                    break
            if None in events or self._stopped:
                return
            try:
                self._reconcile(events)
            except Exception:
                if self._stopped or self.client.status in ("closing", "closed"):
                    return
                # A blip in the connection to the scheduler: keep the events, try again.
                logger.exception("daskqueue: following the cluster's membership failed; retrying")
                for event in events:
                    self._events.put(event)
                time.sleep(RETRY_S)

    def _reconcile(self, events: list[Any]) -> None:
        """Diff the scheduler's list with the last one; a worker that left and came back
        on the same address between two looks still counts as having left."""
        now = self._scheduler_workers()
        msgs = [msg for _, msg in events if isinstance(msg, dict)]
        said_left = {msg["worker"] for msg in msgs if msg.get("action") in ("leave", "remove-worker")}
        retiring = {w for msg in msgs if msg.get("action") == "retiring" for w in msg["workers"]}
        left = (self.workers - now) | (said_left & self.workers)
        joined = (now - self.workers) | (said_left & now)
        self.workers = now
        self.retiring = (self.retiring | retiring) & now - joined
        retiring &= now
        if not joined and not left and not retiring:
            return
        logger.info("daskqueue: workers joined %s, left %s, retiring %s", sorted(joined), sorted(left),
                    sorted(retiring))
        with self._lock:
            listeners = [r() for r in self._listeners]
            self._listeners = [r for r in self._listeners if r() is not None]
        for listener in listeners:
            if listener is None:
                continue
            try:
                listener.on_membership(joined, left, retiring)
            except Exception:
                logger.exception("daskqueue: %r failed to follow the cluster", listener)


_by_client: dict[str, Membership] = {}
_by_client_lock = threading.Lock()


def membership(client: Client) -> Membership:
    """The :class:`Membership` of ``client``, started on first use (one per client)."""
    with _by_client_lock:
        m = _by_client.get(client.id)
        if m is None or m._stopped:
            m = _by_client[client.id] = Membership(client)
        return m


def forget(client: Client) -> None:
    """Stop and forget the membership of ``client`` (when its last pool closes)."""
    with _by_client_lock:
        m = _by_client.pop(client.id, None)
    if m is not None:
        m.close()
