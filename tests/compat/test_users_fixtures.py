"""Point 11 of issue 22: a user's test suite built on ``distributed.utils_test``'s fixtures
(``client``, ``loop``, ``cluster_fixture``, ``cleanup``) passes their teardown checks (no
leaked thread) with daskqueue pools in its tests. The suite is ``users_suite.py``,
run in a pytest of its own, as a user's suite is: those fixtures terminate every child
process of the test process, which would take this suite's shared cluster with them."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

SUITE = pathlib.Path(__file__).with_name("users_suite.py")
ROOT = SUITE.parent.parent.parent


@pytest.mark.timeout(420)
def test_a_users_suite_on_distributed_utils_test_fixtures_passes_their_teardown_checks(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-c", "/dev/null",
         "--rootdir", str(ROOT), "-W", "ignore::DeprecationWarning", "--timeout", "180", str(SUITE)],
        capture_output=True, text=True, timeout=400, cwd=ROOT,
    )
    tail = done.stdout[-3000:]
    assert done.returncode == 0, tail
    assert "3 passed" in done.stdout and "leaked" not in done.stdout, tail
