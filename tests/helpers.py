"""Waiting on a condition instead of sleeping a fixed time: every wait has a timeout."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import time
from typing import Any, Awaitable, Callable


def wait_until(predicate: Callable[[], Any], *, timeout_s: float = 30.0, interval_s: float = 0.01) -> None:
    """Call ``predicate`` every ``interval_s`` until it is true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout_s} s: {_describe(predicate)}")
        time.sleep(interval_s)


async def wait_until_async(
    predicate: Callable[[], Any | Awaitable[Any]], *, timeout_s: float = 30.0, interval_s: float = 0.01
) -> None:
    """``wait_until`` on the running event loop: sleeps with ``asyncio.sleep`` (other tasks
    run meanwhile); ``predicate`` may be a plain or an async function."""
    deadline = time.monotonic() + timeout_s
    while not await _truth(predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout_s} s: {_describe(predicate)}")
        await asyncio.sleep(interval_s)


async def _truth(value: Any) -> bool:
    return bool(await value) if inspect.isawaitable(value) else bool(value)


def _describe(predicate: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)


def kill_worker(client: Any, address: str) -> None:
    """SIGKILL the process of the worker at ``address``, as the OOM killer or preemption would."""
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)
