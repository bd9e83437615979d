"""The pools' reactions to the cluster's membership changes, each pool's on a thread of its
own, so that one pool's slow or stuck reaction (a durable queue recovering for minutes on its
new worker, a hand-off waiting for a successor) holds neither the membership thread nor the
other pools.

A :class:`Reactor` runs one listener's reactions in the order they were given, one at a time,
on a thread (``daskqueue-reaction``) that exists only while it has reactions to run: an idle
pool costs no thread. :class:`Reactions` keeps one reactor per listener; the membership
thread hands each change to the listeners' reactors in the listeners' order and waits for
each reaction at most a bound (:data:`~daskqueue.defaults.REACTION_WAIT_S`), so that pools
that react quickly still react in order, and a slow one is logged and left running.

A pool that was slow finds several changes waiting: it gets them as one (:func:`merge`),
with the view of the newest, as it did when every reaction ran in turn on the membership
thread and the changes that came meanwhile were diffed in one look. So a slow pool catches
up in one reaction, and never spends one on a worker that joined and left meanwhile. A
change comes with a *view* (the membership's workers and retiring workers then), and
:func:`seen` gives the reaction running on the calling thread the view of its change.
"""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from typing import Any

__all__ = ["Reactor", "Reactions", "merge", "seen"]

logger = logging.getLogger("daskqueue")

Change = tuple[set[str], set[str], set[str]]  # joined, left, retiring

_local = threading.local()  # .views: {id(owner): view} of the reaction on this thread


def merge(changes: list[Change]) -> Change:
    """One change that says what ``changes``, in order, said: a worker that joined and then
    left counts as having left only; one that left and came back, as both (the way the
    membership diffs two looks at the scheduler); one that left is no longer retiring."""
    joined: set[str] = set()
    left: set[str] = set()
    retiring: set[str] = set()
    for came, went, going in changes:
        joined = (joined - went) | came
        left |= went
        retiring = (retiring - went) | going
    return joined, left, retiring


def seen(owner: Any, default: Any) -> Any:
    """The view of ``owner`` that came with the change the calling thread is reacting to;
    ``default`` on any other thread (or for another owner)."""
    views = getattr(_local, "views", None)
    return views.get(id(owner), default) if views else default


class Reactor:
    """Runs ``listener.on_membership(joined, left, retiring)`` for each change given to
    :meth:`submit`, in order, one at a time. Holds the listener weakly: a listener that is
    garbage collected gets no more calls. Thread-safe."""

    def __init__(self, listener: Any) -> None:
        self._listener = weakref.ref(listener)
        self._pending: collections.deque[tuple[Change, threading.Event]] = collections.deque()
        self._lock = threading.Lock()
        self._running = False

    def submit(self, joined: set[str], left: set[str], retiring: set[str], *, owner: Any = None,
               view: Any = None) -> threading.Event:
        """Queue a change, and the ``view`` of ``owner`` that :func:`seen` gives while the
        listener reacts to it; return an event set once the listener's call for it ended
        (ran, raised, or was dropped by :meth:`cancel`)."""
        done = threading.Event()
        with self._lock:
            self._pending.append(((set(joined), set(left), set(retiring)), {id(owner): view}, done))
            start, self._running = not self._running, True
        if start:
            threading.Thread(target=self._run, name="daskqueue-reaction", daemon=True).start()
        return done

    @property
    def busy(self) -> bool:
        """True while a reaction runs (or waits to)."""
        return self._running

    def cancel(self) -> None:
        """Drop the changes not yet given to the listener (the one under way runs to its end)."""
        with self._lock:
            dropped, self._pending = list(self._pending), collections.deque()
        for *_, done in dropped:
            done.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._running = False
                    return
                taken, self._pending = list(self._pending), collections.deque()
            _local.views = taken[-1][1]  # the newest change's view
            try:
                self._react(*merge([change for change, _, _ in taken]))
            finally:
                _local.views = None
                for *_, done in taken:
                    done.set()

    def _react(self, joined: set[str], left: set[str], retiring: set[str]) -> None:
        listener = self._listener()
        if listener is None:
            return
        try:
            listener.on_membership(joined, left, retiring)
        except Exception:  # the contract: a listener must not raise; what it raises is logged
            logger.exception("daskqueue: %r failed to follow the cluster", listener)


class Reactions:
    """One :class:`Reactor` per listener (held weakly, by identity)."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._reactors: dict[int, tuple[weakref.ref[Any], Reactor]] = {}
        self._lock = threading.Lock()

    def react(self, listeners: list[Any], joined: set[str], left: set[str], retiring: set[str],
              stopped: threading.Event, *, owner: Any = None, view: Any = None) -> None:
        """Give the change (with ``owner``'s ``view``, see :func:`seen`) to each listener's
        reactor, in order, waiting for each reaction at most ``wait_s``; a reaction still
        running then is logged and left to finish. A listener still busy with an earlier
        change is not waited for (it gets this one when it is done). Returns early once
        ``stopped`` is set."""
        for listener in listeners:
            if stopped.is_set():
                return
            reactor = self._reactor(listener)
            behind = reactor.busy
            done = reactor.submit(joined, left, retiring, owner=owner, view=view)
            if behind:
                logger.info("daskqueue: %r is still reacting to an earlier change; it gets this one "
                            "when it is done", listener)
            elif not done.wait(self.wait_s):
                logger.warning("daskqueue: %r is still reacting to the cluster's change after %g s; "
                               "the other pools go on meanwhile", listener, self.wait_s)

    def submit(self, listener: Any, joined: set[str], left: set[str], retiring: set[str], *, owner: Any = None,
               view: Any = None) -> threading.Event:
        """Give one listener a change, after those it was given before, without waiting for
        it (see :meth:`Reactor.submit`)."""
        return self._reactor(listener).submit(joined, left, retiring, owner=owner, view=view)

    def discard(self, listener: Any) -> None:
        """Forget ``listener``'s reactor, dropping the changes it has not started."""
        with self._lock:
            entry = self._reactors.pop(id(listener), None)
        if entry is not None:
            entry[1].cancel()

    def cancel_all(self) -> None:
        with self._lock:
            entries, self._reactors = list(self._reactors.values()), {}
        for _, reactor in entries:
            reactor.cancel()

    def _reactor(self, listener: Any) -> Reactor:
        with self._lock:
            self._reactors = {k: v for k, v in self._reactors.items() if v[0]() is not None}
            entry = self._reactors.get(id(listener))
            if entry is None or entry[0]() is not listener:
                entry = self._reactors[id(listener)] = (weakref.ref(listener), Reactor(listener))
            return entry[1]
