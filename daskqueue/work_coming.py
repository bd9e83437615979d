"""Process-local hints that work is about to reach this process's consumers.

A queue that receives a put while consumers' long polls wait on it says so here
(:func:`work_coming`), before it stores the put; whoever listens in the same process (a
consumer's child-process runner, :class:`daskqueue.consumer.isolate.ProcessRunner`) may
get ready for it meanwhile, e.g. wake its idle child so that the child's wake-up overlaps
the queue's own work instead of following it. A hint only: a listener may ignore it, and
the work may go to another process's consumer.

Event-loop only (the queue actor and the consumers of a worker share its loop). Listeners
are held weakly: one that is collected stops listening.
"""

from __future__ import annotations

import logging
import weakref
from typing import Protocol

__all__ = ["Listener", "listen", "work_coming"]

logger = logging.getLogger("daskqueue")


class Listener(Protocol):
    def work_coming(self) -> None: ...


_listeners: weakref.WeakSet[Listener] = weakref.WeakSet()


def listen(listener: Listener) -> None:
    """Call ``listener.work_coming()`` on every hint from now on (while it lives)."""
    _listeners.add(listener)


def work_coming() -> None:
    """Tell every listener of this process that work is probably coming. Never raises."""
    for listener in list(_listeners):
        try:
            listener.work_coming()
        except Exception:  # a hint: never the put's problem
            logger.debug("work_coming hint to %r failed", listener, exc_info=True)
