"""Functions that run on the workers (module-level so they pickle by reference; no lambdas)."""

from __future__ import annotations

import ctypes
import gc
import time
from typing import Any

import psutil


def noop(x: Any) -> Any:
    """Return the argument unchanged."""
    return x


def noop_after(x: Any, dep: Any = None) -> Any:
    """A no-op that depends on another future (``dep``), so it waits in the scheduler."""
    return x


def sleep_for(seconds: float) -> None:
    """Sleep ``seconds`` (the simulated work of one document page)."""
    time.sleep(seconds)


def sleep_timed(seconds: float) -> float:
    """Sleep ``seconds``; return how long the sleep really took (``time.sleep`` overshoots
    by tens of microseconds here, which matters for millisecond tasks)."""
    t0 = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - t0


def started_at(x: Any = None) -> float:
    """Return the wall clock (``time.time()``) when the task started running."""
    return time.time()


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def rss() -> int:
    """This process's resident set size in bytes (as is)."""
    return psutil.Process().memory_info().rss


def rss_trimmed() -> int:
    """RSS in bytes after ``gc.collect()`` and ``malloc_trim(0)``: memory actually retained."""
    _trim()
    return psutil.Process().memory_info().rss


def cpu_seconds() -> tuple[float, float, float]:
    """``(user, system, wall)`` CPU seconds of this process (all threads) and ``time.time()``."""
    t = psutil.Process().cpu_times()
    return t.user, t.system, time.time()


def scheduler_task_count(dask_scheduler: Any = None) -> int:
    """How many tasks the scheduler holds (for ``client.run_on_scheduler``)."""
    return len(dask_scheduler.tasks)


def sleep_span(seconds: float) -> tuple[float, float]:
    """Sleep ``seconds``; return ``(start, end)`` in wall-clock seconds (every worker of a
    ``LocalCluster`` shares the machine's clock, so spans compare across processes)."""
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


def burn_cpu(seconds: float) -> int:
    """Keep a core busy in pure Python for ``seconds`` (holding the GIL, as CPU-bound user
    code does); return how many loop rounds it ran."""
    end = time.perf_counter() + seconds
    rounds = 0
    while time.perf_counter() < end:
        for _ in range(1000):
            rounds += 1
    return rounds
