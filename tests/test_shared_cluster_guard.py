"""The shared cluster's guard (tests/conftest.py) counts the workers the scheduler has, not
``Client.scheduler_info()``'s cache: the client refreshes that cache every
``distributed.client.scheduler-info-interval`` with ``n_workers=0`` (no per-worker entries),
and a read that meets a refresh sees no worker at all. CI's "the shared cluster had 0 workers"
warnings, with no test named as having changed them, were such reads."""

from __future__ import annotations

import warnings

import dask
import pytest
from distributed import Client

from tests.conftest import SHARED_WORKERS, _restore_shared_workers


@pytest.mark.timeout(120)
def test_the_guard_never_counts_workers_a_cache_refresh_hid(cluster, client):
    # A client refreshing its cache every 5 ms meets the guard's reads often (every 2 s, the
    # default, about once in 20 s of back-to-back reads).
    with dask.config.set({"distributed.client.scheduler-info-interval": "5ms"}):
        with Client(cluster, set_as_default=False) as fast:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the guard warns when it finds workers missing
                for _ in range(1500):
                    assert len(_restore_shared_workers(cluster, fast, before="this test")) == SHARED_WORKERS
