"""When a batch sent ahead of a free run slot starts: :class:`StartGate`.

A consumer fetches batches ahead of its free run slots (``prefetch_batches``) and sends
them to its runner at once (its child process, see ``daskqueue.consumer.child``), so that
a run slot that frees starts the next batch there and then, with no round trip to the
consumer's event loop. The gate decides, where the batches run, which one starts when a
slot frees, and which ones never start: those the consumer took back (it is stopping) and
those past their latest start (``start_by``: the walltime guard's say, see
:meth:`daskqueue.consumer.walltime.WalltimeGuard.latest_start`). Those go back to the
consumer unrun, and it gives them back to their queue: nothing is lost, nothing runs twice.

Pure: no clock reads (``now`` is a parameter, seconds since the epoch like ``start_by``),
no threads, no I/O. Not thread-safe: its owner holds a lock around every call.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["Arrival", "NotStarted", "StartGate", "Waiting"]


class Arrival(Enum):
    """What became of a batch that arrived at the gate."""

    START = "start"  # a slot was free and is now its: start it
    WAIT = "wait"  # every slot of its kind runs: it waits, in arrival order
    REFUSE = "refuse"  # past its latest start: never started, send it back


@dataclass(slots=True, eq=False)
class Waiting:
    """A batch at the gate: ``key`` names it to its owner, ``item`` is what to run."""

    key: Any
    item: Any
    reserved: bool = False  # a reserved slot's (urgent) batch: reserved slots only
    start_by: float | None = None  # the latest start allowed (epoch s); None: any time

    def too_late(self, now: float) -> bool:
        return self.start_by is not None and now > self.start_by


class NotStarted(Exception):
    """A batch sent ahead came back unrun: taken back (its consumer stops) or, with
    ``late``, past its latest start (it would end after the worker leaves)."""

    def __init__(self, late: bool) -> None:
        super().__init__("past its latest start" if late else "taken back before it started")
        self.late = late


class StartGate:
    """The run slots of one runner (``general`` and ``reserved``) and the batches waiting
    for one, first come first started per kind. Every batch that arrives is started exactly
    once or refused exactly once (``arrive``, ``finished``, ``take_back`` say which)."""

    def __init__(self, general: int, reserved: int = 0) -> None:
        if general < 1 or reserved < 0:
            raise ValueError(f"a gate needs general >= 1 and reserved >= 0 slots, got {general}, {reserved}")
        self._free = {False: general, True: reserved}
        self._slots = {False: general, True: reserved}
        self._waiting: dict[bool, deque[Waiting]] = {False: deque(), True: deque()}

    def arrive(self, batch: Waiting, now: float) -> Arrival:
        """A batch arrives. START takes a slot for it (give it back with ``finished``)."""
        if batch.too_late(now):
            return Arrival.REFUSE
        # Behind others of its kind it waits its turn, even if a slot is free (it cannot be,
        # since ``finished`` starts the next one at once; kept for the order's sake).
        if self._free[batch.reserved] > 0 and not self._waiting[batch.reserved]:
            self._free[batch.reserved] -= 1
            return Arrival.START
        self._waiting[batch.reserved].append(batch)
        return Arrival.WAIT

    def finished(self, reserved: bool, now: float) -> tuple[Waiting | None, list[Waiting]]:
        """A batch of that kind ended: its slot frees. Returns the next waiting batch, which
        takes the slot (start it now, and call ``finished`` again when it ends), or None; and
        the batches refused on the way (past their latest start: send them back)."""
        waiting = self._waiting[reserved]
        refused = []
        while waiting:
            batch = waiting.popleft()
            if not batch.too_late(now):
                return batch, refused
            refused.append(batch)
        if self._free[reserved] >= self._slots[reserved]:
            raise RuntimeError("a slot was given back that was never taken")
        self._free[reserved] += 1
        return None, refused

    def take_back(self) -> list[Waiting]:
        """Every waiting batch, which will never start now (send them back). Running ones
        run on: they are past the gate."""
        out = [*self._waiting[False], *self._waiting[True]]
        for waiting in self._waiting.values():
            waiting.clear()
        return out

    @property
    def waiting(self) -> int:
        """How many batches wait for a slot."""
        return len(self._waiting[False]) + len(self._waiting[True])

    def running(self, reserved: bool = False) -> int:
        """How many slots of that kind run a batch."""
        return self._slots[reserved] - self._free[reserved]

    def validate(self) -> None:
        """Check the invariants (tests call it after every step)."""
        for kind in (False, True):
            assert 0 <= self._free[kind] <= self._slots[kind], (kind, self._free, self._slots)
            # A batch waits only while every slot of its kind runs.
            assert not self._waiting[kind] or self._free[kind] == 0, (kind, self._free)
