"""The command line, run as a user would: a real process starting a real LocalCluster."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_tasks_and_prints_throughput():
    done = subprocess.run(
        [sys.executable, "-m", "daskqueue.cli", "demo", "--tasks", "20000"],
        capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "20,000 tasks in" in done.stdout and "tasks/s" in done.stdout


def test_bad_arguments_exit_with_a_usage_error():
    done = subprocess.run(
        [sys.executable, "-m", "daskqueue.cli", "demo", "--tasks", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2 and "--tasks" in done.stderr
