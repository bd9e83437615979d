"""Task functions of the executor and joblib backend tests: importable on the workers."""

from __future__ import annotations

import os
import time


def inc(x):
    return x + 1


def add(x, y, *, z=0):
    return x + y + z


def boom(x):
    raise ValueError(f"boom {x}")


def fail_on(x, bad):
    if x == bad:
        raise ValueError(f"bad item {x}")
    return x * x


def nap_then(x, seconds):
    time.sleep(seconds)
    return x


def pid(_=None):
    return os.getpid()


class TwoPartError(Exception):
    """An error whose constructor needs two arguments: not rebuildable from its text."""

    def __init__(self, code, detail):
        super().__init__(code, detail)


def raise_two_part(_):
    raise TwoPartError(7, "detail")


def wait_for_gate(x, path):
    """Return ``x`` once ``path`` exists (the test creates it when it is ready), at most 50 s."""
    deadline = time.monotonic() + 50
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return x
