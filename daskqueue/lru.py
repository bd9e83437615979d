"""A bounded map that forgets what was used longest ago: the one cache type for task
functions, so that a caller sending a new function per request (``submit(lambda: ...)``)
does not grow any table without end.

Thread-safe: every method that changes which entries exist holds the map's lock for a few
dict operations, never while it calls out; :meth:`LRU.get`, on every fetch and every task
run, takes none (each of its two dict operations is atomic under the GIL, and an entry
evicted between them is simply not made the newest). Entries are held strongly until
evicted.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, Hashable, Iterable, TypeVar

__all__ = ["LRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``max_entries`` entries; a :meth:`get` hit or a :meth:`put` makes an entry the
    newest, and a put beyond the bound evicts the oldest."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries!r}")
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __repr__(self) -> str:
        return f"<LRU: {len(self._entries)} of {self.max_entries} entries>"

    def get(self, key: K, default: V | None = None) -> V | None:
        entries = self._entries
        try:
            value = entries[key]
        except KeyError:
            return default
        try:
            entries.move_to_end(key)
        except KeyError:  # evicted by another thread since: nothing to make the newest
            pass
        return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def update(self, items: Iterable[tuple[K, V]]) -> None:
        for key, value in items:
            self.put(key, value)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
