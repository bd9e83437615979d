"""Pickling task functions on the client: once per ``batch_submit``/``map`` call, and reused
across calls while the pickle cannot have changed.

A function pickled *by reference* (an importable name) is kept by identity among the last
:data:`~daskqueue.defaults.FUNCTION_CACHE_ENTRIES` used, and so is a ``partial`` of one with
immutable arguments; a callable whose pickle carries state (an instance, a bound method, a
partial holding a list) is pickled on every call, since that state may change between calls.
A function pickled *by value* (``__main__``, a lambda, a closure) is reused while made of
the same objects (:mod:`daskqueue.function_snapshot`). Each pickle is named by a 16-byte
digest; :class:`SentFunctions` is what a pool remembers having sent each queue. Every table
here is bounded (:class:`~daskqueue.lru.LRU`).
"""

from __future__ import annotations

import functools
import hashlib
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import cloudpickle

from daskqueue import defaults
from daskqueue.errors import InvalidTaskError, SerializationError
from daskqueue.function_snapshot import ByValueCache, frozen
from daskqueue.lru import LRU

__all__ = ["PickledFunction", "pickle_function", "SentFunctions", "BY_VALUE_CACHE_MAX_BYTES"]

PROTOCOL = pickle.HIGHEST_PROTOCOL


@dataclass(frozen=True, slots=True)
class PickledFunction:
    """A function's pickle and the digest that names it."""

    digest: bytes
    data: bytes


def _by_value(func: Callable[..., Any]) -> bool:
    """True if plain pickle would store ``func``, or what it wraps, by a reference the
    workers cannot resolve. A ``functools.partial`` pickles as its function and arguments,
    each by reference when it can: it goes by value if its function, or a callable (or an
    instance of a class defined in ``__main__``) among its arguments, would not resolve."""
    if _unresolvable(func):
        return True
    if isinstance(func, functools.partial):
        inner = (func.func, *func.args, *func.keywords.values())
        return any(_by_value(x) if callable(x) else type(x).__module__ == "__main__" for x in inner)
    return False


def _unresolvable(obj: Any) -> bool:
    """Whether ``obj``'s pickle by reference names what a worker cannot import: defined in
    ``__main__``, a lambda, or local to a function."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", "")
    return module in (None, "__main__") or "<lambda>" in qualname or "<locals>" in qualname


#: Functions pickled by reference (the pickle is a name: it never changes), by function.
_by_reference_cache: LRU[Any, PickledFunction] = LRU(defaults.FUNCTION_CACHE_ENTRIES)

#: Functions pickled by value, reused while made of the same objects (see
#: :mod:`daskqueue.function_snapshot`).
_by_value_cache = ByValueCache(defaults.FUNCTION_CACHE_ENTRIES)
BY_VALUE_CACHE_MAX_BYTES = _by_value_cache.max_bytes


def pickle_function(func: Callable[..., Any], *, index: int | None = None) -> PickledFunction:
    """Pickle ``func`` (plain pickle by reference, cloudpickle by value where it must).

    Raises :class:`InvalidTaskError` if ``func`` is not callable and :class:`SerializationError`
    if neither pickler can serialise it; ``index`` names the task in the caller's batch.
    """
    if not callable(func):
        where = "" if index is None else f" (task {index} of the batch)"
        raise InvalidTaskError(f"task function {func!r} is not callable{where}")
    try:
        cached = _by_reference_cache.get(func)
    except TypeError:  # unhashable callable object
        cached = None
    if cached is not None:
        return cached
    by_value = _by_value(func)
    if by_value:
        return _by_value_cache.get_or_make(func, lambda: _pickle_new(func, index, True))
    return _pickle_new(func, index, by_value)


def _pickle_new(func: Callable[..., Any], index: int | None, by_value: bool) -> PickledFunction:
    """Pickle ``func`` now (see :func:`pickle_function`)."""
    try:
        data = cloudpickle.dumps(func, PROTOCOL) if by_value else pickle.dumps(func, PROTOCOL)
    except Exception as first:
        try:
            data = cloudpickle.dumps(func, PROTOCOL)
            by_value = True
        except Exception as e:
            where = "" if index is None else f" (task {index} of the batch)"
            raise SerializationError(f"cannot pickle function {func!r}{where}: {e}", index=index) from first
    pickled = PickledFunction(hashlib.blake2b(data, digest_size=16).digest(), data)
    if not by_value and _pickle_cannot_change(func):
        try:
            _by_reference_cache.put(func, pickled)
        except TypeError:
            pass
    return pickled


def _pickle_cannot_change(func: Callable[..., Any]) -> bool:
    """Whether ``func``'s pickle stays the same while it is the same object, so it may be
    kept by identity: a function or class (its pickle is its name), or a ``partial`` of one
    with immutable arguments. A callable instance, a bound method or a partial holding a
    list pickles the state it holds at that moment: kept, later calls would send stale
    state (a partial's list appended to after its first ``submit``)."""
    if isinstance(func, functools.partial):
        return frozen((func.func, func.args, tuple(func.keywords.items())))
    return frozen(func)


class SentFunctions:
    """The digests of the functions one queue was sent, as far as the client remembers: the
    last :data:`~daskqueue.defaults.SENT_FUNCTIONS_PER_QUEUE` added.

    Used like a ``set`` of digests (``in``, ``add``, ``update``; adding one again makes it
    the newest). Forgetting a digest costs only sending its function again, which a queue
    that still holds it ignores; remembering one the queue no longer holds is what a queue
    that evicts functions must answer (it names the missing digests). Thread-safe.
    """

    def __init__(self, max_entries: int = defaults.SENT_FUNCTIONS_PER_QUEUE) -> None:
        self._digests: LRU[bytes, bool] = LRU(max_entries)

    def __contains__(self, digest: object) -> bool:
        return digest in self._digests

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"<SentFunctions: {len(self._digests)} of {self._digests.max_entries}>"

    def add(self, digest: bytes) -> None:
        self._digests.put(digest, True)

    def update(self, digests: Iterable[bytes]) -> None:
        for digest in digests:
            self._digests.put(digest, True)

    def discard(self, digest: bytes) -> None:
        """Forget ``digest`` (its queue said it no longer holds the function)."""
        self._digests.pop(digest)

    def unsent(self, funcs: dict[bytes, bytes]) -> dict[bytes, bytes]:
        """The entries of ``funcs`` (digest -> pickle) whose digest is not remembered."""
        return {d: data for d, data in funcs.items() if d not in self._digests}
