"""The options of one submission, validated: pure (no Dask, no clock, no I/O)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Union

from daskqueue.errors import ConfigurationError
from daskqueue.queue.encode import PutOptions
from daskqueue.validate import check_number, check_optional_str

__all__ = ["Eta", "MAX_TIME_LIMIT_S", "eta_epoch_s", "put_options"]

#: A due time: a ``datetime`` (naive ones are local time) or seconds since the epoch.
Eta = Union[datetime, float, int, None]

#: The longest time limit a message can carry (a durable queue stores it as a half float).
MAX_TIME_LIMIT_S = 65504.0


def eta_epoch_s(eta: Eta) -> float:
    """Seconds since the epoch of a due time; :class:`ConfigurationError` for anything else."""
    if isinstance(eta, datetime):
        return eta.timestamp()
    if isinstance(eta, (int, float)) and not isinstance(eta, bool) and math.isfinite(eta):
        return float(eta)
    raise ConfigurationError(f"eta must be a datetime or epoch seconds, got {eta!r:.80}")


def put_options(type: str | None, priority: int, key: str | None, delay_s: float, eta: Eta,
                time_limit_s: float | None, *, typed: str | None) -> PutOptions:
    """The validated options of a submission (``typed``: the scheduler of a pool that routes
    by type, which refuses keys; ``time_limit_s`` already defaulted to the pool's)."""
    # Durable queues store the priority in 32 bits.
    check_number("priority", priority, integer=True, at_least=-(2**31), at_most=2**31 - 1)
    check_number("delay_s", delay_s, at_least=0)
    if key is not None and typed is not None:
        raise ConfigurationError(f"key= routes messages by key; a {typed!r} pool routes "
                                 "them by type: use keys in a 'fifo' pool")
    due_epoch = 0.0
    if eta is not None:
        if delay_s:
            raise ConfigurationError("give delay_s or eta, not both")
        due_epoch = eta_epoch_s(eta)
    check_number("time_limit_s", time_limit_s, above=0, at_most=MAX_TIME_LIMIT_S, none_ok=True)
    return PutOptions(check_optional_str("type", type), priority, check_optional_str("key", key),
                      float(delay_s), due_epoch, float(time_limit_s or 0.0))
