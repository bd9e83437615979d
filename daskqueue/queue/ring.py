"""A consistent-hash ring: which queue a routing string (a message type, a key) goes to.

Pure: no Dask, no I/O. Each queue owns ``vnodes`` points on a 64-bit ring (BLAKE2b of
``"<queue>:<vnode>"``); a string goes to the owner of the first point at or after its own
hash, wrapping around. Adding a queue takes over only the arcs just before its new points,
about ``1/(n+1)`` of all strings, where ``hash % n`` would move about ``n/(n+1)`` of them.
Stable across processes and Python runs (no ``hash()``, whose seed varies per process).
"""

from __future__ import annotations

import bisect
from hashlib import blake2b

__all__ = ["HashRing", "stable_hash", "VNODES"]

#: Points per queue: more spread the strings more evenly over the queues.
VNODES = 128


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text``, the same in every process."""
    return int.from_bytes(blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


class HashRing:
    """The ring of queues ``nodes`` (queue indices), ``vnodes`` points each."""

    def __init__(self, nodes: list[int] | range, *, vnodes: int = VNODES) -> None:
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.vnodes = vnodes
        self._points: list[tuple[int, int]] = []
        for node in nodes:
            self.add(node)

    def __repr__(self) -> str:
        return f"<HashRing: {len(self.nodes)} queues x {self.vnodes} points>"

    @property
    def nodes(self) -> list[int]:
        return sorted({n for _, n in self._points})

    def add(self, node: int) -> None:
        """Put queue ``node`` on the ring."""
        if node in self.nodes:
            raise ValueError(f"queue {node} is on the ring already")
        for v in range(self.vnodes):
            bisect.insort(self._points, (stable_hash(f"{node}:{v}"), node))

    def remove(self, node: int) -> None:
        """Take queue ``node`` off the ring: its strings go to the next points' owners."""
        points = [p for p in self._points if p[1] != node]
        if len(points) == len(self._points):
            raise ValueError(f"queue {node} is not on the ring")
        self._points = points

    def node(self, text: str | None) -> int:
        """The queue that ``text`` goes to (``None`` routes as the empty string)."""
        if not self._points:
            raise ValueError("the ring has no queue")
        i = bisect.bisect_left(self._points, (stable_hash(text or ""), -1))
        return self._points[i % len(self._points)][1]
