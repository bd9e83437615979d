"""Handing a queue actor's state to a successor (its worker retires gracefully), in two phases.

The protocol, between the client (``QueuePool``) and this actor:

1. ``hand_off(confirm_s)`` stops serving (every call raises :class:`QueueHandedOffError`),
   releases storage (a durable queue's directory, for the successor to open) and returns the
   state. Provisionally: the actor keeps that state.
2. Then exactly one of:

   * ``handoff_done()``: a successor took the state over. Final: the actor never serves again.
     Returns False if it is too late: the actor serves again already (the bound passed, or an
     abort came), so the successor's copy is stale and must be dropped.
   * ``handoff_abort()``: no successor took it (it could not be started, or the client gave up
     waiting for ``hand_off``'s answer). The actor serves again with the state it holds.
     Returns False if it is too late (``handoff_done`` came first). An abort that arrives while
     ``hand_off`` is still running takes effect as soon as it has finished.
   * neither within ``confirm_s`` (``defaults.HANDOFF_CONFIRM_S``): the actor serves again on
     its own, with a warning; unless its worker released it meanwhile (the client moved the
     queue and freed this actor, or the client is gone), or storage cannot be reopened (a
     successor holds the directory): then the hand-off is final.

``close()`` during the provisional phase makes it final. A mixin of
:class:`~daskqueue.queue.base.QueueActorBase` (see there why mixins). ``_export_handoff`` /
``_import_handoff`` and ``_reopen_storage`` are hooks: a durable queue hands over only its
live leases and fences (the rest is in its directory), and opens its directory again.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from typing import TYPE_CHECKING, Any

from daskqueue import defaults
from daskqueue.queue.handles import released_actor
from daskqueue.serialize import PROTOCOL

if TYPE_CHECKING:
    from daskqueue.queue.core import QueueCore

__all__ = ["HandoffMixin", "handoff_pending"]

#: The key of a hand-off state that says how many messages it holds unsettled.
PENDING_KEY = "pending"


def handoff_pending(state: bytes) -> int:
    """How many messages (ready, delayed or leased) a ``hand_off`` state holds unsettled; a
    state of an actor that does not say counts as 1 (it may hold work)."""
    try:
        return int(pickle.loads(state).get(PENDING_KEY, 1))
    except Exception:  # a state this client cannot read still goes to the successor as it is
        return 1

logger = logging.getLogger("daskqueue")


class HandoffMixin:
    """Remote methods ``hand_off``, ``handoff_done``, ``handoff_abort``."""

    # Owned by QueueActorBase and its other mixins.
    index: int
    _core: QueueCore
    _closed: bool
    _handed_off: bool  # not serving: its state went (perhaps provisionally) to a successor

    def _init_handoff(self) -> None:
        self._handoff_final = False
        self._handoff_aborted = False  # an abort came while hand_off was still running
        self._handoff_wait: asyncio.Task[None] | None = None  # waits for done / abort

    async def hand_off(self, confirm_s: float = defaults.HANDOFF_CONFIRM_S) -> bytes:
        """Stop serving and return what a successor needs to go on where this one stops
        (a pickled dict; ``_import_handoff`` of the same class takes it). Provisional until
        ``handoff_done``; serves again after ``handoff_abort`` or ``confirm_s`` seconds
        without either (see the module docstring).

        Every call from now on raises :class:`QueueHandedOffError` (nothing of it done: the
        caller repeats it at the successor); waiters are woken; a compaction running now
        finishes first. The state is read after the sweeper has stopped, so it is complete.
        """
        if confirm_s <= 0:
            raise ValueError(f"confirm_s must be > 0, got {confirm_s!r}")
        self._check_serving()
        self._handed_off, self._handoff_final, self._handoff_aborted = True, False, False
        await self._stop_serving()
        self._close_storage()
        exported = self._export_handoff(self._now())
        # Whether the state needs a worker soon (the client reads it when no worker can take
        # it now: it asks adapt for one only then); an importer ignores it.
        exported[PENDING_KEY] = self._core.stats().pending
        state = pickle.dumps(exported, PROTOCOL)
        if self._handoff_aborted:
            await self._serve_again("the hand-off was called off while it ran")
        elif not self._handoff_final:
            self._handoff_wait = asyncio.get_running_loop().create_task(self._wait_for_verdict(confirm_s))
        return state

    async def handoff_done(self) -> bool:
        """A successor took the state over: this actor never serves again. False if it is
        too late for that: it serves again already (the successor's copy is stale)."""
        if not self._handed_off:
            return False
        await self._make_handoff_final()
        return True

    async def handoff_abort(self) -> bool:
        """No successor took the state: serve again with it. False if it is too late for
        that (``handoff_done`` came first); True if it serves again (or will, once a running
        ``hand_off`` has finished), or never stopped."""
        if self._handoff_final:
            return False
        if not self._handed_off:
            return True
        if self._handoff_wait is None:  # hand_off is still running: it resumes when done
            self._handoff_aborted = True
            return True
        await self._stop_verdict_wait()
        return await self._serve_again("the client called the hand-off off")

    async def _wait_for_verdict(self, confirm_s: float) -> None:
        await asyncio.sleep(confirm_s)
        self._handoff_wait = None
        logger.warning("queue %d: its hand-off was neither confirmed nor called off within %.0f s",
                       self.index, confirm_s)
        await self._serve_again("no verdict came")

    async def _serve_again(self, why: str) -> bool:
        """Serve again with the state this actor holds; returns whether it does. It does not
        if its worker released it (its pool's client moved the queue or is gone), or if its
        storage cannot be had again (a successor holds the directory): the hand-off is then
        final."""
        if released_actor(self):
            logger.info("queue %d: %s, but its worker released it: it stays handed off", self.index, why)
            await self._make_handoff_final()
            return False
        try:
            self._reopen_storage()
        except Exception as e:
            logger.warning("queue %d: %s, but its storage cannot be reopened (%s: %s): it stays handed off",
                           self.index, why, type(e).__name__, e)
            await self._make_handoff_final()
            return False
        self._handed_off = self._closed = False
        self._start()
        self._work_changed()
        logger.warning("queue %d: %s; it serves again", self.index, why)
        return True

    async def _make_handoff_final(self) -> None:
        """Never serve again; stop the wait for a verdict (and wait for it to end)."""
        self._handoff_final = True
        await self._stop_verdict_wait()

    async def _stop_verdict_wait(self) -> None:
        task, self._handoff_wait = self._handoff_wait, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    def _reopen_storage(self) -> None:
        """Take storage back after a hand-off that did not happen (nothing in memory)."""

    def _export_handoff(self, now: float) -> dict[str, Any]:
        """The whole state (in memory, the only copy): messages, leases, dead letters,
        results not fetched, functions, put tokens."""
        return {
            "core": self._core.export_state(now=now),
            "funcs": self._funcs.export(),  # held and idle: the successor holds them all
            "results": self._results,
            "results_base": self._results_base,
            "producers": self._producers.export(now),  # their cursors, liveness and forgotten tags
            "tokens": self._tokens,
            "outcome_tokens": self._outcome_tokens,
            "adopted": self._adopted,  # the given ids of attached producers' adopted runs
            "get_calls": self._get_calls,
            "task_s": self._task_s,
        }

    def _import_handoff(self, state: dict[str, Any]) -> None:
        self._core.import_state(state["core"], now=self._now())
        self._funcs.load(state["funcs"])
        self._results = state["results"]
        self._results_base = state["results_base"]
        if "producers" in state:  # a predecessor of an older version had none
            self._producers.load(state["producers"], self._now())
        self._tokens = state["tokens"]
        self._outcome_tokens = state.get("outcome_tokens", {})  # none from an older predecessor
        if state.get("adopted") is not None:
            self._adopted = state["adopted"]
        self._get_calls = state["get_calls"]
        self._task_s = state["task_s"]
