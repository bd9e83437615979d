"""``Fences``: the keys a queue must not run yet, by the queue they moved from.

A key is fenced while a queue it moved from (its *source*) may still hold one of its
messages: per-key order says that one runs first. Pure, not thread-safe; the queue core
owns the one instance of its queue and carries it in its exported state.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["Fences", "ANY_SOURCE"]

#: The source of keys fenced without naming one (``QueueCore.fence``): released only by
#: ``release(ANY_SOURCE, keys)`` or ``release_everywhere``.
ANY_SOURCE = -1


class Fences:
    """Fenced keys per source queue index. A key is fenced while any source holds it."""

    def __init__(self) -> None:
        self._by_source: dict[int, set[str]] = {}

    def add(self, source: int, keys: Iterable[str]) -> None:
        """Fence ``keys`` until ``source`` says it holds none of their messages."""
        keys = set(keys)
        if keys:
            self._by_source.setdefault(source, set()).update(keys)

    def release(self, source: int, keys: Iterable[str]) -> None:
        """``source`` holds none of ``keys`` any more (still fenced if another source holds them)."""
        held = self._by_source.get(source)
        if held is None:
            return
        held.difference_update(keys)
        if not held:
            del self._by_source[source]

    def release_everywhere(self, keys: Iterable[str]) -> None:
        """Unfence ``keys`` whatever source fenced them."""
        keys = set(keys)
        for source in list(self._by_source):
            self.release(source, keys)

    def held_by(self, source: int) -> set[str]:
        """The keys fenced for ``source`` (a copy)."""
        return set(self._by_source.get(source, ()))

    def by_source(self) -> dict[int, set[str]]:
        """``{source: keys}`` (copies)."""
        return {source: set(keys) for source, keys in self._by_source.items()}

    def keys(self) -> set[str]:
        """Every fenced key."""
        return set().union(*self._by_source.values()) if self._by_source else set()

    def __contains__(self, key: object) -> bool:
        return any(key in keys for keys in self._by_source.values())

    def __bool__(self) -> bool:
        return bool(self._by_source)

    def snapshot(self) -> dict[int, list[str]]:
        """A plain, picklable copy (what ``load`` takes)."""
        return {source: sorted(keys) for source, keys in self._by_source.items()}

    def load(self, snapshot: dict[int, list[str]] | list[str]) -> None:
        """Replace the fences by those of a ``snapshot``; a plain list of keys (an older
        export) is fenced for :data:`ANY_SOURCE`."""
        self._by_source = {}
        if isinstance(snapshot, dict):
            for source, keys in snapshot.items():
                self.add(source, keys)
        else:
            self.add(ANY_SOURCE, snapshot)
