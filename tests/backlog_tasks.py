"""Tasks that make a backlog of known length until the test has seen what the backlog was for
(a scale-up), then let the rest of it through at once: importable on the workers."""

from __future__ import annotations

import os
import time


def sleep_until_opened(x, seconds, gate):
    """Sleep ``seconds`` while ``gate`` (a path) does not exist, then return ``x``: a backlog
    of these measures and reports as one of plain sleeps until the test creates ``gate``,
    after which what is left runs without sleeping."""
    if not os.path.exists(gate):
        time.sleep(seconds)
    return x
