"""A pool's demand for a worker: which of its resting queues (no actor, see
:mod:`daskqueue.queue.follow`) it has asked the scheduler a worker for.

The scheduler plugin (:mod:`daskqueue.scheduler_plugin`) keeps every demand it is told on
:data:`~daskqueue.scheduler_plugin.DEMAND_TOPIC` until it is withdrawn or the client
disconnects, and makes the adaptive target at least one worker meanwhile. Each queue asks
once until it is placed: a call that waits for it does not ask again.

Thread safety: used under its follower's lock, or from one thread at a time.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from daskqueue import defaults
from daskqueue.scheduler_plugin import DEMAND_TOPIC

__all__ = ["Demand"]

logger = logging.getLogger("daskqueue")


class Demand:
    """The queues of pool ``pool`` (its ``client`` and ``name``) that asked for a worker."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.wanted: set[int] = set()

    def want(self, queues: Iterable[int]) -> None:
        """Ask for a worker for ``queues`` (those that have not asked yet)."""
        new = sorted(set(queues) - self.wanted)
        if new:
            self.wanted.update(new)
            for q in new:
                self._tell(q, True)
            logger.info("%r asks for a worker for its queues %s", self.pool, new)

    def withdraw(self, q: int | None) -> None:
        """Queue ``q`` (None: every queue) needs no worker any more."""
        if q is None:
            if self.wanted:
                self._tell(None, False)
            self.wanted.clear()
        elif q in self.wanted:
            self.wanted.discard(q)
            self._tell(q, False)

    def _tell(self, q: int | None, want: bool) -> None:
        client = self.pool.client
        msg = {"pool": self.pool.name, "queue": q, "client": client.id, "want": want}
        try:
            client.sync(client.scheduler.log_event, topic=DEMAND_TOPIC, msg=msg,
                        callback_timeout=defaults.CONTROL_CALL_TIMEOUT_S)
        except Exception as e:  # the scheduler may be gone; a call waiting for the queue says so
            logger.warning("%r could not tell the scheduler its demand for a worker: %s: %s", self.pool,
                           type(e).__name__, e)
