"""Handing a queue actor's state to a successor (its worker retires gracefully).

A mixin of :class:`~daskqueue.queue.base.QueueActorBase` (see there why mixins).
``_export_handoff`` / ``_import_handoff`` are hooks: a durable queue hands over only its live
leases and fences (the rest is in its directory).
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

from daskqueue.serialize import PROTOCOL

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore

__all__ = ["HandoffMixin"]


class HandoffMixin:
    """Remote method ``hand_off``."""

    # Owned by QueueActorBase and its other mixins.
    _core: QueueCore
    _handed_off: bool

    async def hand_off(self) -> bytes:
        """Stop serving and return what a successor needs to go on where this one stops
        (a pickled dict; ``_import_handoff`` of the same class takes it).

        Every call from now on raises :class:`QueueHandedOffError` (nothing of it done: the
        caller repeats it at the successor); waiters are woken; a compaction running now
        finishes first. The state is read after the sweeper has stopped, so it is complete.
        """
        self._check_serving()
        self._handed_off = True
        await self.close()
        return pickle.dumps(self._export_handoff(self._now()), PROTOCOL)

    def _export_handoff(self, now: float) -> dict[str, Any]:
        """The whole state (in memory, the only copy): messages, leases, dead letters,
        results not fetched, functions, put tokens."""
        return {
            "core": self._core.export_state(now=now),
            "funcs": self._funcs,
            "results": self._results,
            "results_base": self._results_base,
            "tokens": self._tokens,
            "get_calls": self._get_calls,
            "task_s": self._task_s,
            "fences": self._fences,
        }

    def _import_handoff(self, state: dict[str, Any]) -> None:
        self._core.import_state(state["core"], now=self._now())
        self._funcs = state["funcs"]
        self._results = state["results"]
        self._results_base = state["results_base"]
        self._tokens = state["tokens"]
        self._get_calls = state["get_calls"]
        self._task_s = state["task_s"]
        self._fences = state["fences"]
