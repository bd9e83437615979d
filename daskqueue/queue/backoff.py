"""Retry backoff as a pure function of the attempt number."""

from __future__ import annotations

import random

__all__ = ["compute_backoff"]


def compute_backoff(
    attempt: int, *, base_s: float, max_s: float, jitter: float, rng: random.Random
) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry).

    Exponential: ``min(max_s, base_s * 2**(attempt - 1))``, scaled by a factor drawn uniformly
    from ``[1 - jitter, 1]`` so that a burst of failures does not retry in lock step.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    if not 0 <= jitter <= 1:
        raise ValueError(f"jitter must be in [0, 1], got {jitter}")
    delay = min(max_s, base_s * 2.0 ** min(attempt - 1, 60))
    return delay * (1.0 - jitter * rng.random())
