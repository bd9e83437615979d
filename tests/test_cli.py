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


def test_bench_runs_a_benchmark_of_the_checkout(tmp_path):
    out = tmp_path / "noop.json"
    done = subprocess.run(
        [sys.executable, "-m", "daskqueue.cli", "bench", "noop", "--tasks", "2000", "--baseline-tasks", "50",
         "--warmup", "0", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "tasks/s" in done.stdout and out.exists()


def test_bench_of_an_unknown_benchmark_names_the_choices():
    done = subprocess.run(
        [sys.executable, "-m", "daskqueue.cli", "bench", "nope"], capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2 and "noop" in done.stderr and "durable" in done.stderr
