"""Tasks of the walltime tests (importable on the workers, one argument each, for ``map``):
each logs its start and its end, so that a run cut off by its worker's end shows as a start
with no end, and a rerun as a second start."""

from __future__ import annotations

import os
import time


def _log(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # one write, O_APPEND: atomic
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def logged_run(arg):
    """``arg = (x, seconds, log_path)``: sleep ``seconds``, logging 'start x pid time' and 'end x pid time'."""
    x, seconds, log = arg
    _log(log, f"start {x} {os.getpid()} {time.time():.3f}\n")
    time.sleep(seconds)
    _log(log, f"end {x} {os.getpid()} {time.time():.3f}\n")
    return x


def starts(path) -> dict[int, int]:
    """Task -> how many times it started."""
    counts: dict[int, int] = {}
    with open(path) as f:
        for line in f:
            what, x = line.split()[:2]
            if what == "start":
                counts[int(x)] = counts.get(int(x), 0) + 1
    return counts


def pids(path) -> dict[int, set[int]]:
    """Task -> the processes it started in."""
    out: dict[int, set[int]] = {}
    with open(path) as f:
        for line in f:
            what, x, pid = line.split()[:3]
            if what == "start":
                out.setdefault(int(x), set()).add(int(pid))
    return out


def last_end(path, in_pids) -> float | None:
    """When the last task run in one of the processes ``in_pids`` ended (None: none did)."""
    ends = []
    with open(path) as f:
        for line in f:
            what, _, pid, at = line.split()
            if what == "end" and int(pid) in in_pids:
                ends.append(float(at))
    return max(ends, default=None)
