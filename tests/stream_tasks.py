"""Task functions of the stream tests (importable on the workers by module path)."""

from __future__ import annotations

import os
import time


def slower_first(x):
    """Return ``x`` after ``(20 - x) * 10`` ms: the first items of ``range(20)`` finish last."""
    time.sleep(max(0, 20 - x) * 0.01)
    return x


def zero_waits_for(x, path):
    """Item 0 returns once ``path`` exists (the test creates it once it got others: an
    ordered stream would yield none before it); the others return at once."""
    deadline = time.monotonic() + 50
    while x == 0 and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return x
