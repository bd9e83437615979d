"""Task functions of the stream tests (importable on the workers by module path)."""

from __future__ import annotations

import time


def slower_first(x):
    """Return ``x`` after ``(20 - x) * 10`` ms: the first items of ``range(20)`` finish last."""
    time.sleep(max(0, 20 - x) * 0.01)
    return x


def slow_zero(x):
    """Item 0 takes two seconds; the others return at once."""
    if x == 0:
        time.sleep(2.0)
    return x
