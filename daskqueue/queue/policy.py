"""Which type of message a queue may deliver next: FIFO, fair share, or capped.

Pure: no Dask, no clock, no I/O. A :class:`TypePolicy` answers one question for the queue
core, *how many batches of type t may run at once in the whole pool*, from the pool-wide
count of ready messages per type and the pool's running slots (consumers x
``max_concurrency``). The core counts a type's running batches (one lease = one batch, run
one item after another on one slot) and leases a type only while it is under its limit.

* ``"fifo"``: no limit; the core's plain FIFO-within-priority path, untouched.
* ``"fair"``: while another type waits, a type may hold at most its share of the slots,
  in proportion to its ready messages, never above ``max_type_share`` of them, and at least
  one slot. Alone, a type may use every slot. A share is soft: when no type is under its
  share, the first waiting message goes anyway (a consumer that asks is never refused work).
* ``"capped"``: the fair share, and also at most ``max_type_cap`` batches of any type and
  ``type_caps[t]`` of type t; the lowest applicable limit wins. Caps are hard: a type at
  its cap waits, even on otherwise idle consumers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Mapping

__all__ = ["Scheduler", "TypePolicy", "FIFO"]

Scheduler = Literal["fifo", "fair", "capped"]


@dataclass(frozen=True, slots=True)
class TypePolicy:
    """The type-scheduling settings of a pool (validated by ``PoolConfig``)."""

    scheduler: Scheduler = "fifo"
    max_type_share: float = 0.8
    #: How many runs of ready messages (a put's messages of one type) a queue looks past for
    #: a type under its limit, before the first waiting message goes (``"fair"``) or nothing
    #: does (``"capped"``, when every type in reach is at its cap).
    max_scan: int = 1000
    max_type_cap: int | None = None
    type_caps: Mapping[str | None, int] = field(default_factory=dict)

    @property
    def typed(self) -> bool:
        """Whether deliveries depend on types at all (not ``"fifo"``)."""
        return self.scheduler != "fifo"

    def hard_cap(self, t: str | None) -> int | None:
        """The cap of type ``t`` (``"capped"`` only): the lower of ``max_type_cap`` and
        ``type_caps[t]``; None if neither applies."""
        if self.scheduler != "capped":
            return None
        caps = [c for c in (self.max_type_cap, self.type_caps.get(t)) if c is not None]
        return min(caps) if caps else None

    def share(self, t: str | None, *, ready: Mapping[str | None, int], slots: int) -> int | None:
        """The fair share of type ``t``: its slots while another type has ready messages
        (None: no limit, when it is alone or the pool's slots are unknown)."""
        if slots <= 0 or not any(n > 0 for u, n in ready.items() if u != t):
            return None
        total = sum(ready.values())
        fraction = min(ready.get(t, 0) / total if total else 0.0, self.max_type_share)
        return max(1, math.floor(slots * fraction))

    def limit(self, t: str | None, *, ready: Mapping[str | None, int], slots: int) -> int | None:
        """How many batches of type ``t`` may run at once in the pool (None: no limit)."""
        if not self.typed:
            return None
        limits = [c for c in (self.share(t, ready=ready, slots=slots), self.hard_cap(t)) if c is not None]
        return min(limits) if limits else None


#: The default policy: FIFO within a priority, types ignored.
FIFO = TypePolicy()
