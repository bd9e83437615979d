"""How many messages a consumer asks for: a pure batch sizer.

No clock reads and no I/O: the durations are measured by the caller and passed in, so the
policy is tested directly (``tests/consumer/test_sizer.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["BatchSizer"]

#: A batch size grows at most this many times per batch, so that one lucky fast batch does
#: not make the consumer hoard a slow tail.
MAX_GROWTH = 4


class BatchSizer:
    """Sizes the next batch to about ``target_batch_s`` of work, from measured durations.

    With a fixed ``batch_size`` every batch has that size. Otherwise the size starts at
    ``initial`` and follows a running mean of the time per item, within ``[1, max_size]``.
    Per message type, when batches hold one type (a fair or capped pool), the same adaptive
    size is kept apart: :meth:`sizes_by_type` gives them once two types were seen, so that
    a queue sizes a batch of short tasks for short tasks even beside a backlog of long ones.
    """

    def __init__(self, *, fixed: int | None, initial: int, max_size: int, target_batch_s: float) -> None:
        self.fixed = fixed
        self._initial = fixed or initial
        self._max = max_size if fixed is None else fixed
        self._target_s = target_batch_s
        self.size = self._initial
        self._per_item_s: float | None = None
        self._by_type: dict[str | None, tuple[int, float]] = {}

    def observe(self, done: int, elapsed_s: float, types: Iterable[str | None] = ()) -> None:
        """A batch ran ``done`` items in ``elapsed_s``; ``types`` are its message types."""
        if self.fixed is not None or done == 0:
            return
        per_item = elapsed_s / done
        self._per_item_s = per_item if self._per_item_s is None else 0.5 * (self._per_item_s + per_item)
        self.size = self._bounded(self._per_item_s, self.size)
        kinds = set(types)
        if len(kinds) == 1:
            (t,) = kinds
            size, mean = self._by_type.get(t, (self.size, per_item))
            mean = 0.5 * (mean + per_item)
            self._by_type[t] = (self._bounded(mean, size), mean)

    def _bounded(self, per_item_s: float, current: int) -> int:
        want = int(self._target_s / max(per_item_s, 1e-9))
        return max(1, min(self._max, want, current * MAX_GROWTH))

    def sizes_by_type(self) -> dict[str | None, int] | None:
        """The size per message type, once batches of two types or more were seen."""
        if len(self._by_type) < 2:
            return None
        return {t: size for t, (size, _) in self._by_type.items()}

    def idle(self) -> None:
        """The queues ran dry: the next work may be of another kind; learn its duration afresh."""
        if self.fixed is not None:
            return
        self.size = self._initial
        self._per_item_s = None
        self._by_type.clear()
