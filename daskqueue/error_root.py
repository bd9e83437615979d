"""The root of every daskqueue error, and how errors cross processes.

:mod:`daskqueue.errors` is where users import errors from and where they are listed; this
module holds only what every group of errors shares: :class:`DaskQueueError`, and the way a
subclass with constructor arguments is pickled (by the attributes that hold them). It is
apart so that the groups defined in modules of their own (:mod:`daskqueue.store_errors`)
import their root without importing :mod:`daskqueue.errors`, which re-exports them.

Every class defined outside :mod:`daskqueue.errors` names it as its ``__module__``
(:func:`public_module`, as Trio does for its public names): a remote failure's ``exc_type``
(``"daskqueue.errors.StoreIOError"``), tracebacks and pickles read as they always did.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["DaskQueueError", "public_module"]

#: Where users import every daskqueue error from.
PUBLIC_MODULE = "daskqueue.errors"

T = TypeVar("T", bound=type)


def public_module(cls: T) -> T:
    """Name :data:`PUBLIC_MODULE` as ``cls``'s module (see the module docstring)."""
    cls.__module__ = PUBLIC_MODULE
    return cls


@public_module
class DaskQueueError(Exception):
    """Root of every error raised by daskqueue.

    Errors cross processes pickled: a subclass whose constructor takes arguments names, in
    ``_fields``, the attributes that hold them (in order; keyword-only ones in
    ``_keyword_fields``), and is rebuilt from them."""

    _fields: tuple[str, ...] = ()
    _keyword_fields: tuple[str, ...] = ()

    def __reduce__(self):  # type: ignore[no-untyped-def]
        if not self._fields:
            return super().__reduce__()
        return (_rebuild, (type(self), tuple(getattr(self, f) for f in self._fields),
                           {f: getattr(self, f) for f in self._keyword_fields}))


def _rebuild(cls: type[DaskQueueError], args: tuple[Any, ...], kwargs: dict[str, Any]) -> DaskQueueError:
    return cls(*args, **kwargs)
