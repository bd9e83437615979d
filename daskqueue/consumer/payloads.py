"""Reading a batch's payloads on a run thread: each message's ``data`` from its payload
bytes, and a task's function from its digest.

:class:`PayloadReader` owns the consumer's two function caches (pickled, as the fetcher
stores them; unpickled, as the run threads use them), both bounded, and falls back to the
pickles the batch itself carries when a cache has evicted one since the fetch.

Thread safety: the caches are shared by the run threads (as the fetch loop shares the
pickled one); which batch's pickles a thread falls back to is thread-local
(:meth:`PayloadReader.run_with`).
"""

from __future__ import annotations

import threading
from typing import Any

from daskqueue.lru import LRU
from daskqueue.messages import Kind, Task
from daskqueue.serialize import Segment, loads

__all__ = ["PayloadReader"]


class _Unreadable:
    """The payload of an item of a packed segment that could not be unpickled."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class PayloadReader:
    """Message data and task functions from a batch's bytes; ``max_functions`` bounds each
    function cache."""

    def __init__(self, max_functions: int) -> None:
        # digest -> pickled function (from the queues; the fetcher fills it), and unpickled (on
        # a run thread): the newest used only, so that a new function per request does not
        # grow them for good.
        self.pickled: LRU[bytes, bytes] = LRU(max_functions)
        self._loaded: LRU[bytes, Any] = LRU(max_functions)
        self._running = threading.local()  # .funcs: the pickles of the batch this thread runs

    def run_with(self, funcs: dict[bytes, bytes] | None) -> None:
        """The pickles this thread falls back to from now on: its batch's (None: done)."""
        self._running.funcs = funcs

    def counts(self) -> tuple[int, int]:
        """How many functions the caches hold: ``(pickled, unpickled)``."""
        return len(self.pickled), len(self._loaded)

    @staticmethod
    def values(seg: Segment) -> list[Any] | None:
        """A packed segment's values, unpickled once (each an unreadable marker, that
        :meth:`data` raises, if that fails); None for a segment of one payload per item."""
        try:
            return seg.values() if seg.packed else None
        except Exception as e:
            return [_Unreadable(e)] * seg.count

    def data(self, seg: Segment, payload: Any, loaded: bool = False) -> Any:
        """A message's ``data`` from its payload bytes (or its unpickled payload if ``loaded``)."""
        value = payload if loaded else loads(payload)
        if type(value) is _Unreadable:
            raise value.error.with_traceback(None)  # the same error for each item, one traceback
        if seg.kind == Kind.RAW:
            return value
        func = self.function(seg.digest)
        if seg.kind == Kind.CALL:
            return Task(func, value)
        args, kwargs = value
        return Task(func, args, kwargs)

    def function(self, digest: bytes | None) -> Any:
        """The function of ``digest``: from the caches, else from the pickles of the batch this
        thread runs (the caches are bounded and may have evicted it since the fetch)."""
        func = self._loaded.get(digest)  # type: ignore[arg-type]
        if func is None:
            data = self.pickled.get(digest)  # type: ignore[arg-type]
            if data is None:
                data = (getattr(self._running, "funcs", None) or {}).get(digest)
            if data is None:
                raise LookupError(f"function {digest!r} is unknown to this consumer's queue")
            func = loads(data)
            self._loaded.put(digest, func)  # type: ignore[arg-type]
        return func
