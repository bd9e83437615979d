"""The table of functions a consumer's child process holds, kept by its parent.

The parent decides what the child holds (:class:`ChildFunctions`); each run message tells the
child what to add and what to drop (``daskqueue.consumer.child``). Imported by
:mod:`daskqueue.consumer.isolate`, which exports it too.
"""

from __future__ import annotations

from collections import OrderedDict

from daskqueue.defaults import CONSUMER_FUNCTION_CACHE_ENTRIES

__all__ = ["ChildFunctions"]


class ChildFunctions:
    """The digests of the functions a child holds: the parent decides. Each run message
    carries the functions the child lacks and the digests it must drop (the oldest past
    ``max_entries``, never one of that batch's), and the child applies both in order: the
    pipe is ordered, so the child's table is always this one."""

    def __init__(self, max_entries: int = CONSUMER_FUNCTION_CACHE_ENTRIES) -> None:
        self.max_entries = max_entries
        self._held: OrderedDict[bytes, None] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, digest: object) -> bool:
        return digest in self._held

    def plan(self, digests: set[bytes], funcs: dict[bytes, bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
        """For a batch naming ``digests`` (pickles in ``funcs``): what to send with it and
        what the child drops first. Counts both as done: send them next, before any other run
        message."""
        needed = {d: funcs[d] for d in digests if d not in self._held and d in funcs}
        for d in digests:
            if d in self._held:
                self._held.move_to_end(d)
        self._held.update(dict.fromkeys(needed))
        drop = []
        while len(self._held) > self.max_entries:
            oldest = next(iter(self._held))
            if oldest in digests:  # only this batch's functions are left: keep them all
                break
            del self._held[oldest]
            drop.append(oldest)
        return needed, drop
