"""A pool's demand for a worker: which of its resting queues (no actor, see
:mod:`daskqueue.queue.follow`) it has asked the scheduler a worker for.

The scheduler plugin (:mod:`daskqueue.scheduler_plugin`) keeps every demand it is told on
:data:`~daskqueue.scheduler_plugin.DEMAND_TOPIC` until it is withdrawn or the client
disconnects, and makes the adaptive target at least one worker meanwhile. Each queue asks
once until it is placed: a call that waits for it does not ask again.

Thread safety: a call waiting for a queue asks (on the user's thread) while the membership
reaction may place that queue and withdraw: each asks or withdraws under a lock of its own,
and an ask checks under it that the queue still rests (``resting``), so that a demand never
outlives its queue's placement (it would keep the cluster from going back to zero).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterable

from daskqueue import defaults
from daskqueue.scheduler_plugin import DEMAND_TOPIC

__all__ = ["Demand"]

logger = logging.getLogger("daskqueue")


class Demand:
    """The queues of pool ``pool`` (its ``client`` and ``name``) that asked for a worker;
    ``resting`` is the set of the pool's queues that have no actor now (read under the lock)."""

    def __init__(self, pool: Any, resting: set[int]) -> None:
        self.pool = pool
        self.resting = resting
        self.wanted: set[int] = set()
        self._lock = threading.Lock()

    def want(self, queues: Iterable[int]) -> None:
        """Ask for a worker for those of ``queues`` that rest and have not asked yet. The
        caller takes a queue out of ``resting`` before it withdraws its demand."""
        with self._lock:
            new = sorted((set(queues) & self.resting) - self.wanted)
            if not new:
                return
            self.wanted.update(new)
            for q in new:
                self._tell(q, True)
        logger.info("%r asks for a worker for its queues %s", self.pool, new)

    def withdraw(self, q: int | None) -> None:
        """Queue ``q`` (None: every queue) needs no worker any more."""
        with self._lock:
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
