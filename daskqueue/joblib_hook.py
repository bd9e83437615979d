"""Registering the ``"daskqueue"`` joblib backend without importing joblib.

joblib is optional, and importing it costs tens of milliseconds; ``import daskqueue`` must not
pay that. :func:`register_when_imported` (called by ``daskqueue/__init__.py``) registers the
backend at once if joblib is already imported, else when it is imported later: a finder at the
front of ``sys.meta_path`` answers only for the name ``joblib``, lets the other finders find it,
and runs the registration right after joblib's own module has executed, then steps aside. If
joblib is never imported, nothing else happens (and no module is searched for).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["register_when_imported"]

logger = logging.getLogger("daskqueue")


def _register() -> None:
    try:
        from daskqueue.joblib_backend import register

        register()
    except Exception as e:  # a joblib too old or too new must not break importing it
        logger.warning("the 'daskqueue' joblib backend could not be registered: %s: %s", type(e).__name__, e)


class _Loader:
    """Runs joblib's own loader, then registers the backend."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

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
        if name != "joblib":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        _uninstall()
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


_finder = _JoblibFinder()


def _uninstall() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def register_when_imported() -> None:
    """Register the backend now if joblib is imported, else once it is (see the module
    docstring). Idempotent."""
    if "joblib" in sys.modules:
        _register()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
