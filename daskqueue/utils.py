"""daskqueue 0.2.0's ``daskqueue.utils``, kept for old scripts: only ``logger`` (deprecated:
use ``logging.getLogger("daskqueue")``, the logger every daskqueue module logs to)."""

from __future__ import annotations

import logging
from typing import Any

from daskqueue.compat import deprecated

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    if name == "logger":
        deprecated("daskqueue.utils.logger", 'daskqueue.utils.logger is daskqueue 0.2.0\'s spelling; use '
                   'logging.getLogger("daskqueue")')
        return logging.getLogger("daskqueue")
    raise AttributeError(f"module 'daskqueue.utils' has no attribute {name!r}")
