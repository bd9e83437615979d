"""daskqueue 0.2.0's ``daskqueue.utils``, kept for old scripts: only ``logger`` (deprecated:
use ``logging.getLogger("daskqueue")``, the logger every daskqueue module logs to).

As 0.2.0's, the logger prints: taking it gives the ``daskqueue`` logger a stream handler at
the level of the ``LOGLEVEL`` environment variable (default INFO), unless it has a handler
already (see :func:`daskqueue.compat.print_logs`)."""

from __future__ import annotations

import logging
from typing import Any

from daskqueue.compat import deprecated, print_logs

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    if name == "logger":
        deprecated("daskqueue.utils.logger", 'daskqueue.utils.logger is daskqueue 0.2.0\'s spelling; use '
                   'logging.getLogger("daskqueue") (and configure logging to see its lines)')
        print_logs()
        return logging.getLogger("daskqueue")
    raise AttributeError(f"module 'daskqueue.utils' has no attribute {name!r}")
