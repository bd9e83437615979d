"""The dependency floors in pyproject.toml are versions that have what daskqueue calls."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def floor(name: str) -> tuple[int, ...]:
    match = re.search(rf'"{name}>=([0-9.]+)"', PYPROJECT.read_text())
    assert match, f"no floor for {name}"
    return tuple(int(p) for p in match.group(1).split("."))


@pytest.mark.timeout(10)
def test_distributed_floor_has_scheduler_identity_with_n_workers():
    # Client.scheduler_info(n_workers=-1) and Scheduler.identity(n_workers=...) came with
    # distributed 2025.4.0 (dask/distributed#9045); before, identity() refuses n_workers.
    assert floor("distributed") >= (2025, 4, 0)
    assert floor("dask") >= (2025, 4, 0)  # distributed 2025.4.0 pins dask == 2025.4.0
