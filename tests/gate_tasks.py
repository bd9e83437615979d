"""Tasks and a consumer class for the tests of batches sent ahead to a child process
(tests/consumer/test_child_gate.py, tests/consumer/test_sent_ahead.py): importable by a
consumer's child process."""

from __future__ import annotations

import os
import time
from typing import Any

from daskqueue.consumer.base import ConsumerBase


def note(path: str, line: str) -> None:
    """Append ``line`` to ``path`` (one write: lines from two processes never mix)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().split()


def run_until_released(x: int, started: str, release: str) -> int:
    """Note that task ``x`` started (a line in ``started``); wait until ``release`` exists."""
    note(started, str(x))
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    return x


def noted(x: int, started: str) -> int:
    """Note that task ``x`` ran; a function of its own (the child is sent it with its batch)."""
    note(started, str(x))
    return x


class LoggingConsumer(ConsumerBase):
    """Items are ``(name, log path, seconds)``: notes ``start:name`` in the log, sleeps, notes
    ``end:name``; returns the name."""

    def process_item(self, message: Any) -> Any:
        name, path, seconds = message.data
        note(path, f"start:{name}")
        time.sleep(seconds)
        note(path, f"end:{name}")
        return name
