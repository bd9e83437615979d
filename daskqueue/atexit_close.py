"""Pools left open when the interpreter exits are closed first, quietly.

A script that ends without closing its pools (as daskqueue 0.2.0's README did) would
otherwise leave the client to shut down under actors with calls in flight (consumers' long
polls, the result collector's fetches): Dask then cancels those calls, and may print their
``FutureCancelledError`` tracebacks at exit. This hook, registered after ``distributed``'s own
(``atexit`` runs the last registered first), closes the consumer pools and then the queue
pools while their client still runs, and logs rather than raises.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from typing import Any

__all__ = ["track"]

logger = logging.getLogger("daskqueue")

_open: weakref.WeakSet[Any] = weakref.WeakSet()


def track(pool: Any) -> None:
    """Close ``pool`` at interpreter exit if it is still open then."""
    _open.add(pool)


def _close_open_pools() -> None:
    pools = list(_open)
    # Consumers first: they settle what they hold while their queues are still there.
    for pool in sorted(pools, key=lambda p: 0 if hasattr(p, "queue_pool") else 1):
        if getattr(pool, "_closed", True) or getattr(pool, "_opening", None) is not None:
            continue
        status = getattr(pool.client, "status", None)
        status = getattr(status, "value", status)
        if status != "running":  # the client is gone already: nothing can be closed cleanly
            continue
        try:
            pool.close()
        except Exception as e:  # exiting: a pool that cannot close must not print a traceback
            logger.debug("closing %r at exit failed: %s: %s", pool, type(e).__name__, e)


atexit.register(_close_open_pools)
