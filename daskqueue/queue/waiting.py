"""Waiting for an ``asyncio.Event`` with a timeout, without a task per wait.

``asyncio.wait_for`` (before Python 3.12) wraps the awaitable in a task of its own: every
long poll that is woken then costs extra event-loop rounds (the inner task wakes, then the
outer one) on the path of a single task. ``asyncio.timeout`` (3.11+) cancels the waiting
coroutine's own await instead; on 3.10 this falls back to ``wait_for``.
"""

from __future__ import annotations

import asyncio

__all__ = ["wait_event"]

_timeout = getattr(asyncio, "timeout", None)


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``event``; whether it was set."""
    if event.is_set():
        return True
    if _timeout is None:  # Python 3.10
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
    try:
        async with _timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return False
