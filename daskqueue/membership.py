"""Which workers the cluster has, as the scheduler sees it, pushed to the pools.

A :class:`MembershipPlugin` on the scheduler publishes every worker that joins or leaves on
the ``daskqueue-membership`` event topic. On the client, one :class:`Membership` per client
subscribes to it and runs a thread of its own (``daskqueue-membership``) that reconciles the
events with the scheduler's worker list and calls its listeners, the pools, with the
workers that joined and left. The pools therefore follow the cluster with no call from the
user, and they do their blocking work (starting actors, telling queues) on that thread,
never on the client's event loop and never on the user's thread.

Listeners are held weakly: a pool that is garbage collected stops listening. A listener's
``on_membership(joined, left)`` must not raise; what it raises is logged.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from typing import Any, Protocol

from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["MembershipPlugin", "Membership", "membership", "TOPIC"]

logger = logging.getLogger("daskqueue")

#: The scheduler event topic on which the plugin publishes joins and leaves.
TOPIC = "daskqueue-membership"

#: How long ``close`` waits for the thread (a listener call it is in must finish first).
CLOSE_TIMEOUT_S = 30.0

#: How long the thread waits before it tries again after reading the worker list failed.
RETRY_S = 1.0


class MembershipPlugin(SchedulerPlugin):
    """Publishes ``{"action": "join" | "leave", "worker": address}`` on :data:`TOPIC`."""

    name = "daskqueue-membership"
    idempotent = True  # one per scheduler, however many pools register it

    def add_worker(self, scheduler: Any, worker: str) -> None:
        scheduler.log_event(TOPIC, {"action": "join", "worker": worker})

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str, **kwargs: Any) -> None:
        scheduler.log_event(TOPIC, {"action": "leave", "worker": worker})


class Listener(Protocol):
    def on_membership(self, joined: set[str], left: set[str]) -> None: ...


class Membership:
    """The workers of one client's cluster, kept current from the scheduler's events.

    ``workers`` is the set of live worker addresses after the last reconciliation. Started by
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
        self._thread = threading.Thread(target=self._run, name="daskqueue-membership", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<Membership: {len(self.workers)} workers, {len(self._listeners)} listeners>"

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
        said_left = {msg["worker"] for _, msg in events
                     if isinstance(msg, dict) and msg.get("action") in ("leave", "remove-worker")}
        left = (self.workers - now) | (said_left & self.workers)
        joined = (now - self.workers) | (said_left & now)
        self.workers = now
        if not joined and not left:
            return
        logger.info("daskqueue: workers joined %s, left %s", sorted(joined), sorted(left))
        with self._lock:
            listeners = [r() for r in self._listeners]
            self._listeners = [r for r in self._listeners if r() is not None]
        for listener in listeners:
            if listener is None:
                continue
            try:
                listener.on_membership(joined, left)
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
