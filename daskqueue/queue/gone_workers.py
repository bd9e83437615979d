"""Calls to every queue of a pool that do not call, wait for or report the queues on workers
the scheduler no longer has.

The pool's membership thread may not have heard of a worker's death yet (``close`` right after
it, or dropping the change it had not reacted to): a call to the queue there fails at once
(its connection reset), or, needing a new connection to the dead address, waits out its whole
deadline. So the scheduler is asked first, and again every ``LOSS_CHECK_S`` while an answer is
awaited; a scheduler that does not answer leaves the wait bounded by the caller's deadline
alone. The consumer pool's side is :meth:`daskqueue.consumer.members.Members.ask_all`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any

from daskqueue.scheduler_query import scheduler_workers

__all__ = ["call_alive", "is_done", "LOSS_CHECK_S", "LOSS_ASK_TIMEOUT_S", "LOSS_CONFIRM_S", "TIMEOUTS"]

logger = logging.getLogger("daskqueue")

#: How often a wait for answers (here, and the consumer pool's) asks the scheduler whether a
#: target's worker died meanwhile, and how long that question may take.
LOSS_CHECK_S = 0.5
LOSS_ASK_TIMEOUT_S = 2.0

#: How long a call that could not reach its worker waits for the scheduler to say the worker
#: is gone before it counts as a failure.
LOSS_CONFIRM_S = 3.0

#: What waiting on a call's answer raises when it is not there in time (distinct classes
#: before Python 3.11).
TIMEOUTS = (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)


def call_alive(client: Any, targets: list[tuple[str, Any]], method: str, *args: Any,
               timeout_s: float) -> list[str]:
    """Call ``method(*args)`` on every ``(name, handle)`` concurrently, within one deadline of
    ``timeout_s``, but on those whose worker (``handle._address``) the scheduler of ``client``
    no longer has; never raises. Returns the failures, as text naming the target; a target
    found gone is logged (at INFO), not a failure, also when its call failed at once (the
    worker had just died: the scheduler is asked again for up to ``LOSS_CONFIRM_S`` while
    it still lists a worker that could not be reached, as it learns of a death a moment after)."""
    deadline = time.monotonic() + timeout_s
    gone: set[str] = set()
    looking = _look(client, targets, gone)  # until the scheduler does not answer
    pending: dict[str, tuple[Any, Any]] = {}
    failed: list[tuple[Any, str, bool]] = []  # (handle, text, whether its worker could not be reached)
    for name, handle in targets:
        if handle._address in gone:
            logger.info("%s: its worker %s is gone; not called", name, handle._address)
            continue
        try:
            pending[name] = handle, getattr(handle, method)(*args)
        except Exception as e:  # e.g. Dask already knows the actor lost
            failed.append((handle, f"{name}: {type(e).__name__}: {e}", isinstance(e, OSError)))
    next_look = time.monotonic() + LOSS_CHECK_S if looking else deadline
    while pending:
        now = time.monotonic()
        if now >= deadline:
            break
        if now >= next_look:
            looking = _look(client, [(n, h) for n, (h, _) in pending.items()], gone)
            for n in [n for n, (h, _) in pending.items() if h._address in gone]:
                logger.info("%s: its worker %s is gone; not waited for", n, pending.pop(n)[0]._address)
            next_look = time.monotonic() + LOSS_CHECK_S if looking else deadline
            continue
        name = next(iter(pending))
        handle, future = pending[name]
        try:
            future.result(timeout=max(0.001, min(deadline, next_look) - now))
        except TIMEOUTS:
            if not is_done(future):
                continue  # not answered yet: look whether its worker is still there
            failed.append((handle, f"{name}: no answer to {method}", False))
        except Exception as e:
            failed.append((handle, f"{name}: {type(e).__name__}: {e}", isinstance(e, OSError)))
        del pending[name]
    failed += [(h, f"{name}: no answer to {method} within {timeout_s:g} s", False)
               for name, (h, _) in pending.items()]
    if failed and looking:
        _confirm(client, failed, gone, until=min(deadline, time.monotonic() + LOSS_CONFIRM_S))
    for h, text, _ in failed:
        if h._address in gone:
            logger.info("%s (its worker is gone)", text)
    return [text for h, text, _ in failed if h._address not in gone]


def _confirm(client: Any, failed: list[tuple[Any, str, bool]], gone: set[str], *, until: float) -> None:
    """Ask the scheduler which workers of ``failed`` are gone; while it still lists one that
    could not be reached (a call to a worker that had just died fails at once: its connection
    reset, and the scheduler learns of the death a moment after), again every ``LOSS_CHECK_S``
    up to ``until`` (monotonic)."""
    targets = [(text, h) for h, text, _ in failed]
    while _look(client, targets, gone) and time.monotonic() + LOSS_CHECK_S < until:
        if not any(unreachable and h._address not in gone for h, _, unreachable in failed):
            return
        time.sleep(LOSS_CHECK_S)


def _look(client: Any, targets: list[tuple[str, Any]], gone: set[str]) -> bool:
    """Add to ``gone`` the workers of ``targets`` the scheduler no longer has; whether it answered."""
    try:
        alive = set(scheduler_workers(client, timeout_s=LOSS_ASK_TIMEOUT_S))
    except Exception as e:
        logger.debug("the scheduler's workers not read: %s: %s", type(e).__name__, e)
        return False
    gone |= {h._address for _, h in targets if h._address not in alive}
    return True


def is_done(future: Any) -> bool:
    done = getattr(future, "done", None)
    return bool(done()) if done is not None else True
