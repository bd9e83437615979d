"""Calls to every queue of a pool that do not call, wait for or report the queues on workers
the scheduler no longer has.

The pool's membership thread may not have heard of a worker's death yet (``close`` right after
it, or dropping the change it had not reacted to): a call to the queue there fails at once
(its connection reset), or, needing a new connection to the dead address, waits out its whole
deadline. So the scheduler is asked first, and again every ``LOSS_CHECK_S`` while an answer is
awaited; a scheduler that does not answer leaves the wait bounded by the caller's deadline
alone. :func:`ask_alive` is the wait itself, which the consumer pool's
:meth:`daskqueue.consumer.members.Members.ask_all` shares.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any, Callable, TypeVar

from daskqueue.scheduler_query import scheduler_workers

__all__ = ["call_alive", "ask_alive", "caller", "is_done", "worker_gone", "LOSS_CHECK_S", "LOSS_ASK_TIMEOUT_S", "LOSS_CONFIRM_S", "TIMEOUTS"]

logger = logging.getLogger("daskqueue")

K = TypeVar("K")

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
    found gone is logged (at INFO), not a failure (see :func:`ask_alive`)."""
    deadline = time.monotonic() + timeout_s
    gone: set[str] = set()
    looking = _look(client, [h._address for _, h in targets], gone)  # until the scheduler does not answer
    calls = []
    for name, handle in targets:
        if handle._address in gone:
            logger.info("%s: its worker %s is gone; not called", name, handle._address)
        else:
            calls.append((name, name, handle._address, caller(handle, method, args)))
    _, failed = ask_alive(calls, method, deadline=deadline, timeout_s=timeout_s, gone=gone, looking=looking,
                          look=lambda addresses: _look(client, addresses, gone))
    return failed


def ask_alive(calls: list[tuple[K, str, str, Callable[[], Any]]], method: str, *, deadline: float,
              timeout_s: float, gone: set[str], looking: bool,
              look: Callable[[list[str]], bool]) -> tuple[dict[K, Any], list[str]]:
    """Make every call of ``calls`` (``(key, name, worker address, call)``; a call returns a
    future) and wait for their answers by ``deadline`` (monotonic; ``timeout_s`` is how the
    failures name it). Returns the answers by key and the failures, as text naming the target.

    While ``looking``, every ``LOSS_CHECK_S`` ``look(addresses)`` adds to ``gone`` those
    workers the scheduler no longer has (False: it did not answer; the deadline alone bounds
    the wait from then on): a call to a worker in ``gone`` is not waited for, and is logged,
    not a failure, also when it failed at once (a worker that had just died: its connection
    reset, and the scheduler learns of the death a moment after, so it is asked again for up
    to ``LOSS_CONFIRM_S`` while it still lists a worker that could not be reached)."""
    pending: dict[K, tuple[str, str, Any]] = {}
    answers: dict[K, Any] = {}
    failed: list[tuple[str, str, bool]] = []  # (address, text, whether the worker could not be reached)
    for key, name, address, call in calls:
        try:
            pending[key] = name, address, call()
        except Exception as e:  # e.g. Dask already knows the actor lost
            failed.append((address, f"{name}: {type(e).__name__}: {e}", isinstance(e, OSError)))
    next_look = time.monotonic() + LOSS_CHECK_S if looking else deadline
    while pending:
        now = time.monotonic()
        if now >= deadline:
            break
        if now >= next_look:
            looking = look([a for _, a, _ in pending.values()])
            for key in [k for k, (_, a, _) in pending.items() if a in gone]:
                name, address, _ = pending.pop(key)
                logger.info("%s: its worker %s is gone; not waited for", name, address)
            next_look = time.monotonic() + LOSS_CHECK_S if looking else deadline
            continue
        key = next(iter(pending))
        name, address, future = pending[key]
        try:
            answers[key] = future.result(timeout=max(0.001, min(deadline, next_look) - now))
        except TIMEOUTS:
            if not is_done(future):
                continue  # not answered yet: look whether its worker is still there
            failed.append((address, f"{name}: no answer to {method}", False))
        except Exception as e:
            failed.append((address, f"{name}: {type(e).__name__}: {e}", isinstance(e, OSError)))
        del pending[key]
    failed += [(a, f"{name}: no answer to {method} within {timeout_s:g} s", False) for name, a, _ in pending.values()]
    if failed and looking:
        _confirm(look, failed, gone, until=min(deadline, time.monotonic() + LOSS_CONFIRM_S))
    for address, text, _ in failed:
        if address in gone:
            logger.info("%s (its worker is gone)", text)
    return answers, [text for address, text, _ in failed if address not in gone]


def caller(handle: Any, method: str, args: tuple[Any, ...]) -> Callable[[], Any]:
    """A call of ``handle.method(*args)`` to make later (the method is looked up then too: an
    actor handle may raise there, its actor known lost)."""
    return lambda: getattr(handle, method)(*args)


def _confirm(look: Callable[[list[str]], bool], failed: list[tuple[str, str, bool]], gone: set[str], *,
             until: float) -> None:
    """Ask the scheduler which workers of ``failed`` are gone; while it still lists one that
    could not be reached, again every ``LOSS_CHECK_S`` up to ``until`` (monotonic)."""
    addresses = [a for a, _, _ in failed]
    while look(addresses) and time.monotonic() + LOSS_CHECK_S < until:
        if not any(unreachable and a not in gone for a, _, unreachable in failed):
            return
        time.sleep(LOSS_CHECK_S)


def _look(client: Any, addresses: list[str], gone: set[str]) -> bool:
    """Add to ``gone`` those of ``addresses`` the scheduler no longer has; whether it answered."""
    try:
        alive = set(scheduler_workers(client, timeout_s=LOSS_ASK_TIMEOUT_S))
    except Exception as e:
        logger.debug("the scheduler's workers not read: %s: %s", type(e).__name__, e)
        return False
    gone |= {a for a in addresses if a not in alive}
    return True


def worker_gone(client: Any, address: str, *, within_s: float = LOSS_CONFIRM_S) -> bool:
    """Whether the scheduler of ``client`` no longer has the worker at ``address``, asked
    every ``LOSS_CHECK_S`` up to ``within_s`` (a worker that just died is still listed until
    the scheduler notices); False if the scheduler does not answer."""
    deadline = time.monotonic() + within_s
    while True:
        gone: set[str] = set()
        if not _look(client, [address], gone):
            return False
        if gone or time.monotonic() + LOSS_CHECK_S > deadline:
            return bool(gone)
        time.sleep(LOSS_CHECK_S)


def is_done(future: Any) -> bool:
    done = getattr(future, "done", None)
    return bool(done()) if done is not None else True
