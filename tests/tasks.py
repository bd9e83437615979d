"""Task functions for the tests: importable on the workers by module path."""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_running = 0


def double(x):
    return 2 * x


def add(x, y=0, *, z=0):
    return x + y + z


def boom(x):
    raise ValueError(f"boom {x}")


def fail_if_odd(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def sleep_then(x, seconds):
    time.sleep(seconds)
    return x


def concurrency_probe(seconds):
    """Sleep; return how many probes were running in this process when this one started."""
    global _running
    with _lock:
        _running += 1
        seen = _running
    try:
        time.sleep(seconds)
    finally:
        with _lock:
            _running -= 1
    return seen


def logged_sleep(x, seconds, log_path):
    """Sleep; append 'x start end pid' to ``log_path`` (one write, O_APPEND: atomic)."""
    start = time.time()
    time.sleep(seconds)
    line = f"{x} {start:.6f} {time.time():.6f} {os.getpid()}\n".encode()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return x


def getpid(_=None):
    return os.getpid()


def pid_after(x, seconds):
    """Sleep, then return ``(x, pid)``: which process ran it."""
    time.sleep(seconds)
    return x, os.getpid()


def exit_if(x, bad):
    """``2 * x``, except that ``x == bad`` kills its process, as an OOM kill or a segfault would."""
    if x == bad:
        os._exit(1)
    return 2 * x


class Unpicklable:
    def __reduce__(self):
        raise TypeError("this object refuses to be pickled")


from daskqueue import ConsumerBase  # noqa: E402  (consumers below need it)


class FailingSetup(ConsumerBase):
    """A consumer whose resources cannot be opened."""

    def setup(self):
        raise RuntimeError("cannot open the database")

    def process_item(self, message):
        return message.data


class CountingSetup(ConsumerBase):
    """A consumer with a slow setup; each item returns how many times setup ran."""

    def setup(self):
        time.sleep(0.2)
        with _lock:
            self.setup_calls = getattr(self, "setup_calls", 0) + 1

    def process_item(self, message):
        time.sleep(0.002)
        return self.setup_calls


def sleep_then_arg(x):
    """A short task (half a millisecond) that returns its argument."""
    time.sleep(0.0005)
    return x


def timed_sleep(x, seconds):
    """Sleep; return ``(x, start, end)`` in wall-clock seconds (for overlap checks across
    processes on one machine)."""
    start = time.time()
    time.sleep(seconds)
    return x, start, time.time()


def spin(seconds):
    """Busy-loop in Python for ``seconds`` (interruptible between bytecodes); return them."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


def block_in_c(seconds):
    """Block in one C call (``time.sleep``) that a time limit cannot interrupt."""
    time.sleep(seconds)
    return seconds


def niceness(_=None):
    """The CPU niceness of the process running the task."""
    import os

    return os.nice(0)


def fail_unless_exists(x, path):
    """Raise until the file ``path`` exists; then return ``x`` (a task that succeeds replayed)."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return x


def length(x):
    return len(x)
