"""A queue's successor actor while it starts, and the verdict its predecessor is sent.

The client's side of the two-phase hand-off (the queue's side is :mod:`daskqueue.queue.handoff`);
:class:`~daskqueue.queue.follow.Follower` uses these.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from daskqueue import defaults

__all__ = ["confirm_hand_off", "Submitted", "Start"]

logger = logging.getLogger("daskqueue")


def confirm_hand_off(old: Any, method: str) -> bool:
    """Tell a queue that handed off its state ``handoff_done`` or ``handoff_abort`` (best
    effort, bounded); whether it took effect. A queue without two-phase hand-off (an older
    actor) counts as confirmed: its hand-off was final already."""
    try:
        # False: too late (a queue that serves again already cannot be made final, and the
        # reverse); None: an actor whose methods answer nothing.
        return getattr(old, method)().result(timeout=defaults.CONTROL_CALL_TIMEOUT_S) is not False
    except AttributeError:
        return True
    except Exception as e:
        logger.warning("queue at %s: %s failed: %s: %s", old._address, method, type(e).__name__, e)
        return False


@dataclass
class Submitted:
    """A successor actor submitted, and the scattered hand-off state it starts from."""

    future: Any
    scattered: Any = None

    def done_with_state(self) -> None:
        """The actor started (or failed): the scattered state is not needed any more."""
        if self.scattered is not None:
            self.scattered.release()
            self.scattered = None


@dataclass
class Start:
    """A successor still starting after the membership thread stopped waiting for it."""

    submitted: Submitted
    since: float
    state: bytes | None  # the parked state it was started with (kept if it fails)

    @property
    def future(self) -> Any:
        return self.submitted.future
