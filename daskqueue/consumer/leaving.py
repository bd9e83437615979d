"""When this worker will leave: the end of its ``--lifetime``, or of its SLURM job.

The shell around :mod:`daskqueue.consumer.walltime` (which decides what work still fits):
this module reads the worker and the batch system.

* ``--lifetime`` (``Worker(lifetime=...)``, dask-jobqueue's ``worker_extra_args``): Dask
  schedules ``close_gracefully`` on the worker's event loop at start-up, the stagger drawn
  then. The time is read off that timer (exact, stagger included); if it cannot be found, it
  is the process's start plus ``worker.lifetime`` (earlier than the truth: on the safe side).
* SLURM (``SLURM_JOB_ID`` set): ``squeue -h -j ID -o %L``, the job's time left (slurm 22.05;
  independent of time zones, unlike ``%e``). The job is killed at its end, so the worker
  retires itself ``SLURM_RETIRE_BEFORE_S`` before (:func:`retire_at`; the environment variable
  ``DASKQUEUE_SLURM_RETIRE_BEFORE_S`` of the job overrides it): a graceful retirement hands
  its queues off. A ``--lifetime`` that ends sooner makes that unnecessary.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import subprocess
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from daskqueue import defaults
from daskqueue.consumer.walltime import parse_slurm_time_left

__all__ = ["Leaving", "lifetime_end", "lifetime_timer", "slurm_end", "slurm_retire_before_s", "leaving_time",
           "retire_at"]

logger = logging.getLogger("daskqueue")

#: The reason Dask gives the lifetime's ``close_gracefully`` (distributed/worker.py).
LIFETIME_REASON = "worker-lifetime-reached"
SQUEUE_TIMEOUT_S = 10.0
RETIRE_BEFORE_ENV = "DASKQUEUE_SLURM_RETIRE_BEFORE_S"


@dataclass(frozen=True, slots=True)
class Leaving:
    """The worker leaves at ``at`` (epoch seconds), because of ``source``: ``"lifetime"``
    (it retires itself then) or ``"slurm"`` (its job is killed then)."""

    at: float
    source: str


def lifetime_end(worker: Any) -> float | None:
    """The epoch time at which ``worker`` closes for its lifetime, or None (no lifetime).
    Event-loop only (it reads the loop's timers)."""
    lifetime = getattr(worker, "lifetime", None)
    if not lifetime:
        return None
    at = lifetime_timer(worker)
    if at is not None:
        return at
    try:
        import psutil

        started = psutil.Process().create_time()
    except Exception:  # no psutil, or no process table: then no end is known
        return None
    return started + float(lifetime)


def lifetime_timer(worker: Any) -> float | None:
    """The epoch time of the timer Dask set for ``worker``'s lifetime close, or None if it
    is not found. It reads asyncio's list of timers (``loop._scheduled``, private, so only
    this function relies on it; tornado wraps the callback in a ``functools.partial``)."""
    loop = asyncio.get_running_loop()
    for handle in list(getattr(loop, "_scheduled", ())):
        args = getattr(handle, "_args", None) or ()
        if not handle.cancelled() and any(_is_lifetime_close(arg, worker) for arg in args):
            return time.time() + (handle.when() - loop.time())
    return None


def _is_lifetime_close(callback: Any, worker: Any) -> bool:
    """Whether ``callback`` is tornado's wrapping of ``worker``'s lifetime close."""
    if not isinstance(callback, functools.partial):
        return False
    func = callback.func
    return (getattr(func, "__self__", None) is worker and getattr(func, "__name__", "") == "close_gracefully"
            and callback.keywords.get("reason") == LIFETIME_REASON)


def slurm_end(*, environ: dict[str, str] | None = None, now: float | None = None,
              run: Callable[..., Any] = subprocess.run) -> float | None:
    """The epoch time at which this process's SLURM job ends, or None (not in a job, no
    limit, or ``squeue`` failed). Blocking (runs ``squeue``): call it off the event loop."""
    env = os.environ if environ is None else environ
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        done = run(["squeue", "-h", "-j", job_id, "-o", "%L"], capture_output=True, text=True,
                   timeout=SQUEUE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        logger.info("cannot ask SLURM when job %s ends (%s: %s)", job_id, type(e).__name__, e)
        return None
    left = parse_slurm_time_left(done.stdout) if done.returncode == 0 else None
    if left is None:
        logger.info("SLURM job %s: no end time (squeue said %r)", job_id, (done.stdout or done.stderr).strip())
        return None
    return (time.time() if now is None else now) + left


async def leaving_time(worker: Any) -> Leaving | None:
    """When ``worker`` leaves: the sooner of its lifetime's end and its SLURM job's end
    (less ``SLURM_RETIRE_BEFORE_S``, when it retires itself); None if neither is known."""
    ends = []
    at = lifetime_end(worker)
    if at is not None:
        ends.append(Leaving(at, "lifetime"))
    job = await asyncio.to_thread(slurm_end)
    if job is not None:
        ends.append(Leaving(job - slurm_retire_before_s(), "slurm"))
    return min(ends, key=lambda leaving: leaving.at, default=None)


def slurm_retire_before_s(environ: dict[str, str] | None = None) -> float:
    """How long before its SLURM job's end a worker retires: ``SLURM_RETIRE_BEFORE_S``, or
    the job's ``DASKQUEUE_SLURM_RETIRE_BEFORE_S`` (seconds)."""
    text = (os.environ if environ is None else environ).get(RETIRE_BEFORE_ENV)
    if text:
        try:
            return max(0.0, float(text))
        except ValueError:
            logger.warning("%s=%r is not a number of seconds; using %g", RETIRE_BEFORE_ENV, text,
                           defaults.SLURM_RETIRE_BEFORE_S)
    return defaults.SLURM_RETIRE_BEFORE_S


#: Workers whose SLURM retirement is arranged already (one per worker, however many consumers).
_arranged: weakref.WeakSet[Any] = weakref.WeakSet()


def retire_at(worker: Any, at: float) -> None:
    """Have ``worker`` retire gracefully at epoch time ``at`` (as its lifetime would), once
    per worker. Event-loop only."""
    if worker in _arranged:
        return
    _arranged.add(worker)
    delay = max(0.0, at - time.time())
    logger.info("worker %s retires in %.0f s, before its SLURM job ends", worker.address, delay)
    worker.io_loop.call_later(delay, functools.partial(worker.close_gracefully, reason="daskqueue-slurm-walltime"))
