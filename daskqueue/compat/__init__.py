"""Coming from daskqueue 0.2.0: its public spellings keep working, each warning once.

``deprecated(key, message)`` issues a :class:`DeprecationWarning` the first time a 0.2.0
spelling is used in this process, pointed at the user's line (not at daskqueue's), naming the
new spelling. The README's "Coming from daskqueue 0.2.0" lists them. The parts:

* :mod:`~daskqueue.compat.old_paths`: 0.2.0's module paths (``daskqueue.QueuePool``, ...);
* :mod:`~daskqueue.compat.queue_pool` and :mod:`~daskqueue.compat.consumer_pool`: the pools'
  0.2.0 arguments and methods;
* :mod:`~daskqueue.compat.consumers`: ``ConsumerBaseClass`` (``process_item`` gets the raw
  item), ``DummyConsumer``; :mod:`~daskqueue.compat.durability`: the ``Durability`` enum.

Where 0.2.0's behaviour cannot be kept, the call fails at once with an error that says what to
write instead.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from typing import Any, Callable

__all__ = ["deprecated", "warn_at_user", "reset_warnings", "old_names", "print_logs"]

_warned: set[str] = set()
_lock = threading.Lock()


def deprecated(key: str, message: str) -> None:
    """Warn once per process about the 0.2.0 spelling ``key``."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warn_at_user(message, DeprecationWarning)


def warn_at_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` pointed at the user's line: the first frame
    outside daskqueue and Python's import machinery."""
    warnings.warn(message, category, stacklevel=_user_stacklevel())


def reset_warnings() -> None:
    """Forget which spellings warned (each warns again once; for tests)."""
    with _lock:
        _warned.clear()


def _user_stacklevel() -> int:
    """The ``stacklevel`` (for the ``warnings.warn`` in :func:`warn_at_user`) of the first frame
    outside daskqueue and Python's import machinery: the line that used the old spelling."""
    frame = sys._getframe(2)  # the caller of warn_at_user(): stacklevel 2
    level = 2
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back  # warnings does not count the import machinery's frames
            continue
        name = frame.f_globals.get("__name__", "")
        if not (name == "daskqueue" or name.startswith("daskqueue.")):
            return level
        frame = frame.f_back
        level += 1
    return 2


def old_names(module: str, names: dict[str, Callable[[], Any]], new: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for 0.2.0's module ``module``: each name of ``names`` (made by
    its function, on first use) warns once for the module, saying ``new``."""

    def __getattr__(name: str) -> Any:
        make = names.get(name)
        if make is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        deprecated(module, f"{module} is daskqueue 0.2.0's module path; {new}")
        return make()

    return __getattr__


_handler: logging.Handler | None = None


def print_logs() -> None:
    """Print daskqueue's log lines as 0.2.0 did (it set a stream handler on import, at the
    level of the ``LOGLEVEL`` environment variable, default INFO): done once, for the 0.2.0
    spellings that expect it (``daskqueue.utils.logger``, ``join(progress=True)``), and only
    when the ``daskqueue`` logger has no handler of its own."""
    global _handler
    log = logging.getLogger("daskqueue")
    with _lock:
        if _handler is not None or any(not isinstance(h, logging.NullHandler) for h in log.handlers):
            return
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("%(asctime)s,%(msecs)d %(levelname)s: %(message)s"))
        log.addHandler(_handler)
        if log.level == logging.NOTSET:
            log.setLevel(os.environ.get("LOGLEVEL", "INFO").upper())
