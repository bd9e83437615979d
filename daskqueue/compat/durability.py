"""daskqueue 0.2.0's ``Durability`` enum (``from daskqueue import Durability``)."""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["Durability", "durability_name"]


class Durability(enum.Enum):
    """0.2.0's spelling of ``QueuePool(durability=)``: ``Durability.DURABLE`` is
    ``durability="durable"``, ``Durability.TRANSIENT`` is ``"transient"``."""

    DURABLE = "durable"
    TRANSIENT = "transient"


def durability_name(durability: Any) -> tuple[Any, bool]:
    """``(the name QueuePool takes, whether it was 0.2.0's enum)``."""
    if isinstance(durability, Durability):
        return durability.value, True
    return durability, False
