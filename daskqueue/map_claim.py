"""The output of one ``map`` call while its outcomes arrive: :class:`MapClaim`.

The result collector (:mod:`daskqueue.results`) files each outcome of a claimed range here,
by input position; ``map`` waits for :attr:`MapClaim.complete` and returns
:attr:`MapClaim.values`. Pure: no Dask, no clock, no I/O, no lock of its own (the collector
files into it). :mod:`daskqueue.stream_claim` does the same for a set of ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from daskqueue.errors import RemoteTaskError

__all__ = ["MapClaim"]


@dataclass(eq=False)
class MapClaim:
    """The output of one ``map`` call: values by input position, and failures.

    ``settled`` counts positions, not deliveries: under at-least-once delivery an outcome
    may arrive twice, and the map is complete only once every position has one. A success
    replaces a failure of the same position (a replayed dead letter), never the reverse.
    """

    n: int
    values: list[Any] = field(default_factory=list)
    failures: dict[int, RemoteTaskError] = field(default_factory=dict)
    settled: int = 0

    def __post_init__(self) -> None:
        self.values = [None] * self.n
        self._done = bytearray(self.n)  # 1: a position's outcome arrived

    @property
    def complete(self) -> bool:
        return self.settled >= self.n

    def succeed(self, position: int, values: list[Any]) -> None:
        """Results of positions ``position ..`` arrived."""
        end = position + len(values)
        self.values[position:end] = values
        self.settled += end - position - self._done[position:end].count(1)
        self._done[position:end] = b"\x01" * (end - position)
        if self.failures:
            for p in range(position, end):
                self.failures.pop(p, None)

    def fail(self, position: int, error: RemoteTaskError) -> None:
        """The final failure of ``position`` arrived (ignored if its outcome is known)."""
        if not self._done[position]:
            self._done[position] = 1
            self.settled += 1
            self.failures[position] = error
