"""When a function pickled *by value* may reuse its last pickle.

cloudpickle stores a function defined in ``__main__`` (a notebook cell, a script) by value:
its code, defaults, closure and the globals its code names, as they are at that moment.
Pickling it again on every ``submit`` costs the client more than anything else before the
first byte is sent (about a third of ``submit``'s own time after an idle gap), yet gives the
same bytes as long as none of those parts changed.

:func:`snapshot` returns what the pickle was made from, or ``None`` when it cannot tell a
change: a snapshot holds the function's code, defaults and closure contents and the values
of the globals its code names, each *by identity*, and only when every one of them is
immutable all the way down (``None``, numbers, strings, bytes, tuples and frozensets of
those), a module, or a function or class that pickles by reference (an importable name).
A list, a dict, a ``__main__`` helper function or class (whose body may change) makes the
function uncacheable: it is pickled on every call, as before. Rebinding a global, editing
``func.__defaults__`` or redefining the function changes an identity, so the next call
pickles again. Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
import operator
import sys
import types
from typing import Any, Callable

from daskqueue.lru import LRU

try:  # cloudpickle's own view of what a function's pickle holds (private: guarded)
    from cloudpickle.cloudpickle import _extract_code_globals, _is_registered_pickle_by_value
except ImportError:  # another cloudpickle: nothing is cached, every call pickles
    _extract_code_globals = None  # type: ignore[assignment]

    def _is_registered_pickle_by_value(module: Any) -> bool:  # no such registry there
        return False

__all__ = ["ByValueCache", "frozen", "parts", "snapshot", "same"]

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis))
_MISSING = object()


def frozen(value: Any, depth: int = 0) -> bool:
    """Whether ``value``'s pickle cannot change while its identity stays the same."""
    if isinstance(value, _IMMUTABLE) or isinstance(value, types.ModuleType):
        return True
    if isinstance(value, (tuple, frozenset)):
        return depth < 4 and all(frozen(v, depth + 1) for v in value)
    if isinstance(value, (types.BuiltinFunctionType, type, types.FunctionType)):
        return _by_reference(value)
    return False


def _by_reference(obj: Any) -> bool:
    """A function or class that pickles as its importable name (its body is not copied)."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", "")
    if module in (None, "__main__") or "<lambda>" in qualname or "<locals>" in qualname:
        return False
    loaded = sys.modules.get(module)
    return loaded is not None and not _is_registered_pickle_by_value(loaded)


def parts(func: types.FunctionType) -> tuple[Any, ...]:
    """Every object plain function ``func``'s by-value pickle is made of, flat: compared
    one by one by identity in :func:`same` (at C speed, on every ``submit``)."""
    globals_ = func.__globals__
    out = [func.__code__, func.__module__, func.__qualname__, func.__name__, func.__doc__,
           func.__defaults__, len(func.__dict__)]
    out.extend(globals_.get(name, _MISSING) for name in _extract_code_globals(func.__code__))
    if func.__closure__:
        out.extend(map(_contents, func.__closure__))
    for mapping in (func.__kwdefaults__, func.__annotations__):
        if mapping:
            out.extend(itertools.chain.from_iterable(mapping.items()))
        out.append(None)  # a separator: a key moved between the two maps is a change
    return tuple(out)


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not assigned yet
        return _MISSING


def snapshot(func: Callable[..., Any]) -> tuple[Any, ...] | None:
    """:func:`parts` of plain function ``func``, or ``None`` if one of them may change
    without changing its identity (see the module docstring)."""
    if type(func) is not types.FunctionType or func.__dict__ or _extract_code_globals is None:
        return None
    now = parts(func)
    objects = now[5:]  # the code, the names and the docstring are immutable
    return now if all(v is _MISSING or frozen(v) for v in objects) else None


def same(before: tuple[Any, ...], func: Callable[..., Any]) -> bool:
    """Whether ``func`` (a function :func:`snapshot` accepted once) still consists of
    exactly the objects of ``before``, by identity. A value of ``before`` was frozen, so
    the same object pickles the same; a different one makes the caller pickle again."""
    now = parts(func)  # type: ignore[arg-type]
    return len(now) == len(before) and all(map(operator.is_, now, before))


class ByValueCache:
    """The last pickle of each by-value function, reused while :func:`same` holds (a
    ``submit`` loop over a notebook function pickles it once). A pickle larger than
    ``max_bytes`` is not kept: it would hold large globals alive."""

    def __init__(self, entries: int, max_bytes: int = 64 * 1024) -> None:
        self.max_bytes = max_bytes
        self._entries: LRU[Any, tuple[tuple[Any, ...], Any]] = LRU(entries)

    def get_or_make(self, func: Callable[..., Any], make: Callable[[], Any]) -> Any:
        """``func``'s kept pickle if it is still made of the same objects, else ``make()``
        (an object with ``data`` bytes), kept when ``func`` can be snapshotted."""
        try:
            entry = self._entries.get(func)
        except TypeError:  # unhashable callable object
            return make()
        if entry is not None and same(entry[0], func):
            return entry[1]
        taken = snapshot(func)
        pickled = make()
        if taken is not None and len(pickled.data) <= self.max_bytes:
            self._entries.put(func, (taken, pickled))
        return pickled
