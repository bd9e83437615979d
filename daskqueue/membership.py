"""Which workers the cluster has, as the scheduler sees it, pushed to the pools; and what
the scheduler learns from the pools.

A :class:`MembershipPlugin` on the scheduler publishes every worker that joins, leaves or is
about to retire on the ``daskqueue-membership`` event topic. On the client, one
:class:`Membership` per client subscribes to it and runs a thread of its own
(``daskqueue-membership``) that reconciles the events with the scheduler's worker list and
calls its listeners, the pools, with the workers that joined, left and are retiring. The
pools therefore follow the cluster with no call from the user, and they do their blocking
work (starting actors, moving queues) on a reaction thread of each pool's
(:mod:`daskqueue.reactions`), never on the client's event loop, never on the user's thread,
and never holding the membership thread (or another pool) longer than
:data:`~daskqueue.defaults.REACTION_WAIT_S`. Every wait of the membership thread is bounded
(``MEMBERSHIP_*`` in :mod:`daskqueue.defaults`).

Lifetime: a pool holds its client's membership from :func:`membership` (``owner=pool``) or
``add_listener`` until :func:`forget` (``forget(pool)``, when the pool closes); once no pool
holds it, its thread ends and the client is no longer referenced. A membership whose client
closed ends its thread by itself within :data:`~daskqueue.defaults.MEMBERSHIP_IDLE_S`.

The scheduler side (the plugin, the retirement hand-off, the adaptive target) lives in
:mod:`daskqueue.scheduler_plugin`; its names are re-exported here.

Listeners are held weakly: a pool that is garbage collected stops listening. A listener's
``on_membership(joined, left, retiring)`` must not raise; what it raises is logged.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from distributed import Client

from daskqueue import defaults
from daskqueue.reactions import Reactions, seen
from daskqueue.scheduler_plugin import (  # re-exported: their users import them from here
    HANDOFF_TIMEOUT_S,
    LOAD_STALE_S,
    LOAD_TOPIC,
    TOPIC,
    MembershipPlugin,
    queue_target,
)
from daskqueue.scheduler_query import register_plugin
from daskqueue.warm import warm_workers

__all__ = ["MembershipPlugin", "Membership", "membership", "forget", "queue_target", "TOPIC", "LOAD_TOPIC",
           "HANDOFF_TIMEOUT_S", "LOAD_STALE_S"]

logger = logging.getLogger("daskqueue")

#: How long ``close`` waits for the thread (it waits for no reaction longer than
#: ``REACTION_WAIT_S``, for the scheduler no longer than ``MEMBERSHIP_CALL_TIMEOUT_S``).
CLOSE_TIMEOUT_S = defaults.MEMBERSHIP_CLOSE_WAIT_S

#: How long the thread waits before it tries again after reading the worker list failed.
RETRY_S = 1.0

#: How long the client may be reconnecting to its scheduler before the pools call the
#: scheduler lost (its workers, and the actors on them, close when it is gone).
SCHEDULER_LOST_S = 5.0


@dataclass(frozen=True)
class View:
    """The membership after one reconciliation."""

    workers: frozenset[str]
    retiring: frozenset[str]


class Listener(Protocol):
    def on_membership(self, joined: set[str], left: set[str], retiring: set[str]) -> None: ...


class Membership:
    """The workers of one client's cluster, kept current from the scheduler's events.

    ``workers`` is the set of live worker addresses after the last reconciliation;
    ``retiring`` those of them being retired (no new actor goes there). Started by
    :func:`membership`; :meth:`close` stops and joins the thread (it also ends by itself
    once its client is closed).
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self._events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._listeners: list[weakref.ref[Any]] = []
        self._holders: weakref.WeakSet[Any] = weakref.WeakSet()  # pools that hold it (see forget)
        self._reactions = Reactions(defaults.REACTION_WAIT_S)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        topic = TOPIC
        try:
            register_plugin(client, MembershipPlugin())
        except Exception as e:  # e.g. daskqueue is not installed where the scheduler runs
            logger.warning("daskqueue: cannot register the membership plugin on the scheduler "
                           "(%s); following the scheduler's 'all' events instead", e)
            topic = "all"
        warm_workers(client)  # a queue that moves to another worker finds its modules loaded
        # Subscribe first, then read the list: a change in between is seen by both, never
        # by neither.
        client.subscribe_topic(topic, self._events.put)
        self._topic = topic
        self._view = View(frozenset(self._scheduler_workers()), frozenset())
        self._unreachable_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="daskqueue-membership", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<Membership: {len(self.workers)} workers, {len(self._listeners)} listeners>"

    @property
    def workers(self) -> frozenset[str]:
        """The live workers: as of the change being reacted to, on a reaction's thread."""
        return self.view.workers

    @property
    def retiring(self) -> frozenset[str]:
        """The workers being retired (no new actor goes there), seen as :attr:`workers` is."""
        return self.view.retiring

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

    @property
    def _stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def view(self) -> View:
        """The workers and the retiring ones, as one snapshot (see :attr:`workers`)."""
        return seen(self, self._view)

    def add_listener(self, listener: Listener, since: View | None = None) -> None:
        """Call ``listener.on_membership`` on every change (it also holds this membership).

        ``since``: the view the listener placed its actors by (a pool starting). What
        changed between it and now reached no call of the listener's: it is given to the
        listener first, on its reaction thread, before any later change."""
        with self._lock:  # the thread updates the view and reads the listeners under it too
            self._listeners.append(weakref.ref(listener))
            self._holders.add(listener)
            if since is None:
                return
            now = self._view
            joined, left = set(now.workers - since.workers), set(since.workers - now.workers)
            retiring = set(now.retiring - since.retiring)
            if joined or left or retiring:
                logger.info("daskqueue: while %r started, workers joined %s, left %s, retiring %s", listener,
                            sorted(joined), sorted(left), sorted(retiring))
                self._reactions.submit(listener, joined, left, retiring, owner=self, view=now)

    def remove_listener(self, listener: Listener) -> None:
        """No more calls to ``listener``; changes it has not started reacting to are dropped."""
        with self._lock:
            self._listeners = [r for r in self._listeners if r() not in (None, listener)]
        self._reactions.discard(listener)

    def hold(self, owner: Any) -> None:
        """``owner`` (a pool) uses this membership until :meth:`release`."""
        with self._lock:
            self._holders.add(owner)

    def release(self, owner: Any) -> bool:
        """``owner`` no longer uses this membership (nor listens); True if no one holds it."""
        self.remove_listener(owner)
        with self._lock:
            self._holders.discard(owner)
            return not self._holders

    def close(self) -> None:
        """Stop the thread and wait for it at most :data:`CLOSE_TIMEOUT_S`; stop following
        the scheduler's events. A reaction under way runs to its end on its own thread."""
        self._stop.set()
        self._events.put(None)
        self._reactions.cancel_all()
        try:
            if self.client.status not in ("closing", "closed"):
                self.client.unsubscribe_topic(self._topic)
        except Exception as e:  # already unsubscribed, or the client is closing meanwhile
            logger.debug("daskqueue: unsubscribing from %s failed: %s", self._topic, e)
        if threading.current_thread() is not self._thread:
            self._thread.join(CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                logger.warning("daskqueue: the membership thread did not end within %g s", CLOSE_TIMEOUT_S)

    # -- the thread -------------------------------------------------------------------------

    def _scheduler_workers(self) -> set[str]:
        """The scheduler's live workers; raises a ``TimeoutError`` after
        ``MEMBERSHIP_CALL_TIMEOUT_S`` (``Client.scheduler_info`` takes no deadline)."""
        info = self.client.sync(self.client.scheduler.identity, n_workers=-1,
                                callback_timeout=defaults.MEMBERSHIP_CALL_TIMEOUT_S)
        return set(info["workers"])

    def _next_events(self) -> list[Any] | None:
        """The events that arrived, at least one; None if the thread is to end (stopped, or
        its client closed while no event came for ``MEMBERSHIP_IDLE_S``)."""
        while not self._stopped:
            try:
                return [self._events.get(timeout=defaults.MEMBERSHIP_IDLE_S)]
            except queue.Empty:
                if self.client.status in ("closing", "closed"):
                    _drop(self)
                    return None
        return None

    def _run(self) -> None:
        while not self._stopped:
            events = self._next_events()
            if events is None:
                return
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
                self._stop.wait(RETRY_S)

    def _reconcile(self, events: list[Any]) -> None:
        """Diff the scheduler's list with the last one; a worker that left and came back
        on the same address between two looks still counts as having left."""
        now = self._scheduler_workers()
        msgs = [msg for _, msg in events if isinstance(msg, dict)]
        said_left = {msg["worker"] for msg in msgs if msg.get("action") in ("leave", "remove-worker")}
        retiring = {w for msg in msgs if msg.get("action") == "retiring" for w in msg["workers"]}
        with self._lock:  # one step with reading the listeners: see add_listener(since=)
            was = self._view
            left = (was.workers - now) | (said_left & was.workers)
            joined = (now - was.workers) | (said_left & now)
            self._view = View(frozenset(now), frozenset((was.retiring | retiring) & now - joined))
            retiring &= now
            if not joined and not left and not retiring:
                return
            listeners = [r() for r in self._listeners]
            self._listeners = [r for r in self._listeners if r() is not None]
        logger.info("daskqueue: workers joined %s, left %s, retiring %s", sorted(joined), sorted(left),
                    sorted(retiring))
        self._reactions.react([x for x in listeners if x is not None], joined, left, retiring, self._stop,
                              owner=self, view=self._view)


_by_client: dict[str, Membership] = {}
_by_client_lock = threading.Lock()


def membership(client: Client, owner: Any = None) -> Membership:
    """The :class:`Membership` of ``client``, started on first use (one per client); held
    by ``owner`` (a pool) from now on, until ``forget(owner)``. A pool passes itself: between
    this call and its ``add_listener``, another pool's ``forget`` then cannot end it."""
    with _by_client_lock:
        m = _by_client.get(client.id)
        if m is None or m._stopped:
            m = _by_client[client.id] = Membership(client)
        if owner is not None:
            m.hold(owner)
        return m


def forget(owner: Any) -> None:
    """Release what ``owner`` held of its client's membership: a pool (anything with a
    ``client``) stops listening, and once no pool holds the membership its thread ends and
    the client is no longer referenced from here; a ``Client`` ends its membership whoever
    holds it. Idempotent; returns within ``MEMBERSHIP_CLOSE_WAIT_S``; call it when a pool
    closes (not from its own reaction to a change, which would wait for itself)."""
    client = owner if isinstance(owner, Client) else getattr(owner, "client", None)
    if client is None:
        return
    with _by_client_lock:
        m = _by_client.get(client.id)
        if m is None or (owner is not client and not m.release(owner)):
            return
        del _by_client[client.id]
    m.close()


def _drop(m: Membership) -> None:
    """Forget ``m`` (its thread is ending: its client closed)."""
    m._stop.set()
    with _by_client_lock:
        if _by_client.get(m.client.id) is m:
            del _by_client[m.client.id]
