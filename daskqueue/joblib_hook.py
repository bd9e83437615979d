"""Registering the ``"daskqueue"`` joblib backend without importing joblib.

joblib is optional, and importing it costs tens of milliseconds; ``import daskqueue`` must not
pay that. :func:`register_when_imported` (called by ``daskqueue/__init__.py``) registers the
backend at once if joblib is already imported, else when it is imported later: a finder at the
front of ``sys.meta_path`` answers only for the name ``joblib``, lets the other finders find it,
and wraps the loader of that spec so that the registration runs right after joblib's own module
has executed. The finder never leaves ``sys.meta_path`` (another thread may be walking it, and a
spec asked for by ``importlib.util.find_spec`` may never be loaded); once the backend is
registered it answers None to everything. If joblib is never imported, nothing else happens
(and no module is searched for).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

__all__ = ["register_when_imported"]

logger = logging.getLogger("daskqueue")


#: The backend is registered: the finder has nothing more to do.
_registered = False
#: Set while this thread's finder asks the other finders (one of them may ask sys.meta_path
#: again, or be a finder of a reloaded copy of this module).
_asking = threading.local()


def _register() -> None:
    global _registered
    try:
        from daskqueue.joblib_backend import register

        register()
        _registered = True
    except Exception as e:  # a joblib too old or too new must not break importing it
        logger.warning("the 'daskqueue' joblib backend could not be registered: %s: %s", type(e).__name__, e)


class _Loader:
    """Runs joblib's own loader, then registers the backend; anything else is joblib's
    loader's (a spec asked for but not loaded may be asked things)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # joblib's module keeps its own loader (resources, reloads).
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _register()


class _JoblibFinder:
    """The ``sys.meta_path`` entry described in the module docstring."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "joblib" or _registered or getattr(_asking, "active", False):
            return None
        _asking.active = True
        try:
            for finder in list(sys.meta_path):  # a copy: others may change it meanwhile
                # Skipped: this one, and one of a reloaded copy of this module (each would
                # ask the other: endless recursion).
                if type(finder).__name__ == type(self).__name__ or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _asking.active = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


_finder = _JoblibFinder()


def register_when_imported() -> None:
    """Register the backend now if joblib is imported, else once it is (see the module
    docstring). Idempotent, also across a reload of this module."""
    if "joblib" in sys.modules:
        _register()
    elif not any(type(f).__name__ == _JoblibFinder.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, _finder)
