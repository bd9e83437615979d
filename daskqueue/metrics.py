"""Prometheus metrics of the daskqueue actors of a worker process (placeholder: filled in by
the metrics work of issue 13)."""

from __future__ import annotations

__all__ = ["ensure_registered"]


def ensure_registered() -> None:
    """Register daskqueue's collector with this process's Prometheus registry (once)."""
