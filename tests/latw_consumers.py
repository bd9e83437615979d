"""Consumer classes for tests/test_latw_child.py: importable by a consumer's child process."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from daskqueue.consumer.base import ConsumerBase


class EchoConsumer(ConsumerBase):
    """Returns ``(item, thread name)``; ``"die"`` ends the process, ``("sleep", s)`` sleeps,
    ``("big", n)`` returns ``n`` bytes."""

    def process_item(self, message: Any) -> Any:
        item = message.data
        if item == "die":
            os._exit(3)
        if isinstance(item, tuple) and item[0] == "sleep":
            time.sleep(item[1])
        if isinstance(item, tuple) and item[0] == "big":
            return b"x" * item[1]
        return item, threading.current_thread().name
