"""Coming from daskqueue 0.2.0: its public spellings keep working, each warning once.

``deprecated(key, message)`` issues a :class:`DeprecationWarning` the first time a 0.2.0
spelling is used in this process, pointed at the user's line (not at daskqueue's), naming the
new spelling. The README's "Coming from daskqueue 0.2.0" lists them.
"""

from __future__ import annotations

import sys
import threading
import warnings

__all__ = ["deprecated", "reset_warnings"]

_warned: set[str] = set()
_lock = threading.Lock()


def deprecated(key: str, message: str) -> None:
    """Warn once per process about the 0.2.0 spelling ``key``."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, DeprecationWarning, stacklevel=_user_stacklevel())


def reset_warnings() -> None:
    """Forget which spellings warned (each warns again once; for tests)."""
    with _lock:
        _warned.clear()


def _user_stacklevel() -> int:
    """The ``stacklevel`` (for a ``warnings.warn`` in :func:`deprecated`) of the first frame
    outside daskqueue and Python's import machinery: the line that used the old spelling."""
    frame = sys._getframe(2)  # the caller of deprecated(): stacklevel 2
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
