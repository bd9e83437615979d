"""The scheduler's side of daskqueue's membership: what the scheduler tells the pools, and
what it learns from the queues.

A :class:`MembershipPlugin` on the scheduler publishes every worker that joins, leaves or is
about to retire on the :data:`TOPIC` event topic (the client side, :mod:`daskqueue.membership`,
follows it). It also changes two of the scheduler's handlers, for every caller (``Client``,
``Adaptive``, a worker ending its ``--lifetime``):

* ``retire_workers``: Dask refuses to retire a worker that holds an actor. Before Dask's own
  retirement runs, the plugin publishes ``retiring`` and waits (at most
  :data:`HANDOFF_TIMEOUT_S`) until the pools have moved their actors off those workers: a
  queue hands its whole state to a successor elsewhere, consumers settle and stop.
* ``adaptive_target``: Dask's adaptive scaling sees only scheduler tasks. Queue actors report
  their backlog on ``daskqueue-load`` every second while they have work; the target becomes
  the larger of Dask's and the workers the queued work needs (see :func:`queue_target`).

  A backlog counts once two reports in a row said so: a queue reports at its first put, again
  at the first settle that leaves work (or ``LOAD_CONFIRM_S``, 0.2 s, later if none comes),
  then every second, and at once when it empties; a map over before the second report must
  not start a worker after the fact. Reports of a worker that left are dropped with it.

  Pools whose queues wait for a worker (created before any joined, or at rest and called
  again) say so on :data:`DEMAND_TOPIC`: while any does, the target is at least one worker.
  A demand stays until its pool withdraws it, or its client disconnects.

  Pools at rest hold no worker: Dask keeps the last worker that holds any data, and an
  actor is data to it. When no scheduler task is queued or running, no queue reports work
  (ready, leased or delayed) and every key the workers hold is an actor of a registered
  daskqueue pool (:mod:`daskqueue.registry`), the target is the queues' (0 when idle):
  ``adapt(minimum=0)`` then retires the last worker, and the pools move their actors off it
  through the retirement hand-off above (they come back when work does).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["MembershipPlugin", "queue_target", "TOPIC", "LOAD_TOPIC", "DEMAND_TOPIC", "HANDOFF_TIMEOUT_S",
           "LOAD_STALE_S"]

logger = logging.getLogger("daskqueue")

#: The scheduler event topic on which the plugin publishes joins, leaves and retirements.
TOPIC = "daskqueue-membership"

#: The topic on which queue actors report their backlog to the scheduler.
LOAD_TOPIC = "daskqueue-load"

#: The topic on which a pool says that queues of its wait for a worker (or no longer do):
#: ``{"pool", "queue", "client", "want"}``; ``queue`` None withdraws all of the pool's.
DEMAND_TOPIC = "daskqueue-demand"

#: How long a retirement waits for the pools to move their actors off the retiring workers
#: before Dask's own retirement runs (which refuses a worker that still holds an actor).
HANDOFF_TIMEOUT_S = 20.0

#: A queue's load report older than this is not counted (its queue stopped reporting).
LOAD_STALE_S = 10.0


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


@dataclass
class _Load:
    """A queue's latest load report: when it came, and since when its reports say it has
    work (None: the latest said it has none)."""

    at: float
    work_since: float | None
    msg: dict[str, Any]

    @property
    def confirmed(self) -> bool:
        """Two reports in a row said the queue has work (a report that outlived a short
        burst of work is not followed by a second one)."""
        return self.work_since is not None and self.at > self.work_since

    @property
    def busy(self) -> bool:
        """The latest report has messages ready, running or delayed."""
        m = self.msg
        return bool(m["ready"] or m["leased"] or m.get("delayed"))


class MembershipPlugin(SchedulerPlugin):
    """Publishes ``{"action": "join" | "leave" | "retiring", ...}`` on :data:`TOPIC`; makes
    retirement wait for the pools' hand-off and adaptive scaling count the queues' backlog
    and the pools' demand (see the module docstring)."""

    name = "daskqueue-membership"
    idempotent = True  # one per scheduler, however many pools register it

    def __init__(self) -> None:
        self.loads: dict[tuple[str, int], _Load] = {}
        self.demand: dict[tuple[str, int], str | None] = {}  # (pool, queue) -> the client that wants it
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
            return self.target(target(target_duration=target_duration), target_duration)

        handlers["retire_workers"] = retire_workers
        handlers["adaptive_target"] = adaptive_target

    def add_worker(self, scheduler: Any, worker: str) -> None:
        scheduler.log_event(TOPIC, {"action": "join", "worker": worker})

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str, **kwargs: Any) -> None:
        # Its queues' backlog went with it, or moves with them (their successors report it).
        self.loads = {k: v for k, v in self.loads.items() if v.msg.get("worker") != worker}
        scheduler.log_event(TOPIC, {"action": "leave", "worker": worker})

    def remove_client(self, scheduler: Any, client: str) -> None:
        self.demand = {k: c for k, c in self.demand.items() if c != client}

    def log_event(self, topic: str, msg: Any) -> None:
        if not isinstance(msg, dict):
            return
        if topic == LOAD_TOPIC:
            key, now = (msg["pool"], msg["queue"]), time.monotonic()
            was = self.loads.get(key)
            work = bool(msg["ready"] or msg["leased"])
            since = (was.work_since if was is not None and was.work_since is not None else now) if work else None
            self.loads[key] = _Load(now, since, msg)
        elif topic == DEMAND_TOPIC:
            pool, queue = msg["pool"], msg.get("queue")
            if msg.get("want"):
                self.demand[(pool, queue)] = msg.get("client")
            elif queue is None:
                self.demand = {k: c for k, c in self.demand.items() if k[0] != pool}
            else:
                self.demand.pop((pool, queue), None)

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

    def target(self, own: int, target_duration: Any = None) -> int:
        """The adaptive target: Dask's own (``own``), the queues' backlog, at least one worker
        while a pool waits for one, and the queues' alone when only idle pools hold workers
        (see the module docstring)."""
        queues = self.queue_target(target_duration)
        if self.demand:
            queues = max(queues, 1)
        elif own > queues and self._pools_idle() and self._only_pools_hold_data():
            return queues
        return max(own, queues)

    def _fresh_loads(self) -> list[_Load]:
        now = time.monotonic()
        self.loads = {k: v for k, v in self.loads.items() if now - v.at < LOAD_STALE_S}
        return list(self.loads.values())

    def _pools_idle(self) -> bool:
        """No queue's latest report has work (ready, leased or delayed: a delayed message
        needs a worker when it falls due)."""
        return not any(load.busy for load in self._fresh_loads())

    def _only_pools_hold_data(self) -> bool:
        """No scheduler task waits or runs, and every key in the workers' memory is an actor
        of a registered daskqueue pool."""
        s = self.scheduler
        if s.queued or s.unrunnable or any(ws.processing for ws in s.workers.values()):
            return False
        held = {ts.key for ws in s.workers.values() for ts in ws.has_what}
        return not held or held <= self._pool_actor_keys()

    def _pool_actor_keys(self) -> set[Any]:
        """The keys of the queue and consumer actors the pools registered."""
        from daskqueue.registry import CONSUMERS_KEY, POOLS_KEY

        s = self.scheduler
        keys: set[Any] = set()
        for entry in (s.get_metadata(keys=[POOLS_KEY], default=None) or {}).values():
            if entry:
                keys.update(ref[2] for ref in entry.get("queues", {}).values())
        for by_pool in (s.get_metadata(keys=[CONSUMERS_KEY], default=None) or {}).values():
            for refs in (by_pool or {}).values():
                keys.update(ref[2] for ref in refs or ())
        return keys

    def queue_target(self, target_duration: Any = None) -> int:
        """Workers the queues' reported backlog needs (0 with no fresh, confirmed report)."""
        import dask
        from dask.utils import parse_timedelta

        loads = [load.msg for load in self._fresh_loads() if load.confirmed]
        if not loads:
            return 0
        s = self.scheduler
        duration = target_duration or dask.config.get("distributed.adaptive.target-duration")
        unknown = dask.config.get("distributed.scheduler.unknown-task-duration")
        nthreads = sum(ws.nthreads for ws in s.workers.values())
        return queue_target(
            loads, target_duration_s=parse_timedelta(duration),
            unknown_task_s=parse_timedelta(unknown),
            threads_per_worker=nthreads / len(s.workers) if s.workers else 1.0,
        )
