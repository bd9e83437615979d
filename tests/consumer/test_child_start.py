"""The consumer's child process starts quietly: what users see at every pool start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from daskqueue.consumer.isolate import CHILD_MAIN


@pytest.mark.timeout(60)
def test_the_child_process_starts_and_ends_without_a_warning():
    # No "init" frame on stdin: the child ends at once, as it does when its parent is gone.
    # Run as ``-m daskqueue.consumer.child`` it printed runpy's RuntimeWarning (the package
    # had imported the module already) in every worker's log, at every consumer start.
    done = subprocess.run([sys.executable, "-W", "default", "-c", CHILD_MAIN],
                          input=b"", capture_output=True, timeout=50)
    assert done.returncode == 0, done.stderr.decode()
    assert b"Warning" not in done.stderr, done.stderr.decode()
