"""The command line, run as a user would: a real process starting a real LocalCluster."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


#: The LocalClusters these commands start fork their workers from a forkserver (distributed
#: loaded once) instead of each worker being a new interpreter that imports it: ~1 s of CPU
#: less per worker on the suite's 2 cores; what the tests check does not depend on it.
FORKSERVER_ENV = dict(os.environ, DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD="forkserver")


def test_demo_runs_tasks_and_prints_throughput():
    done = subprocess.run(
        [sys.executable, "-m", "daskqueue.cli", "demo", "--tasks", "2000"],
        capture_output=True, text=True, timeout=180,
        env=FORKSERVER_ENV,
    )
    assert done.returncode == 0, done.stderr
    assert "2,000 tasks in" in done.stdout and "tasks/s" in done.stdout


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
         "--warmup", "0", "--isolation-runs", "1", "--workers", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=FORKSERVER_ENV,
    )
    assert done.returncode == 0, done.stderr
    assert "tasks/s" in done.stdout and out.exists()


def test_bench_of_an_unknown_benchmark_names_the_choices():
    done = subprocess.run(
        [sys.executable, "-m", "daskqueue.cli", "bench", "nope"], capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2 and "noop" in done.stderr and "durable" in done.stderr


class _PoolLosingOneResult:
    """Stands in for ``QueuePool`` and ``ConsumerPool``; its ``map`` loses the last result."""

    def __init__(self, *args, **kwargs):
        pass

    def map(self, func, iterable, progress=False):
        return [func(x) for x in iterable][:-1]

    def start(self):
        pass

    def close(self):
        pass


@pytest.mark.timeout(60)
def test_demo_that_loses_a_result_exits_with_an_error(monkeypatch, capsys):
    # A real LocalCluster (one worker); only the pools are stand-ins that lose a result. It
    # faked distributed's LocalCluster and Client before: a daskqueue module first imported
    # under that patch kept the fake as its ``Client`` for the rest of the process, and a
    # later test on the same xdist worker was refused ("client must be a distributed.Client,
    # got Client"): tests/compat/test_readme_and_examples.py after this file, in one process.
    import daskqueue
    from daskqueue.cli import main

    monkeypatch.setattr(daskqueue, "QueuePool", _PoolLosingOneResult)
    monkeypatch.setattr(daskqueue, "ConsumerPool", _PoolLosingOneResult)
    assert main(["demo", "--tasks", "10", "--workers", "1"]) == 1
    out = capsys.readouterr()
    assert "9 results for 10 tasks" in out.err and "tasks/s" not in out.out


def test_bench_never_runs_benchmark_code_from_the_current_directory(tmp_path):
    marker = tmp_path / "ran"
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "__init__.py").write_text("")
    (bench / "common.py").write_text("")
    (bench / "noop.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    done = subprocess.run(
        [sys.executable, "-m", "daskqueue.cli", "bench", "noop", "--help"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert not marker.exists() and "no-op" in done.stdout


def test_a_dead_letters_function_that_cannot_be_unpickled_here_is_reported_not_hidden(capsys):
    import pickle

    from daskqueue.cli import _load_functions
    from tests import tasks

    good = pickle.dumps(tasks.double)
    gone = good.replace(b"tests.tasks", b"tests.xxxxx")  # same length: a valid pickle of a missing module
    funcs = _load_functions({b"\x01" * 16: good, b"\x02" * 16: gone})
    assert funcs == {b"\x01" * 16: tasks.double}
    err = capsys.readouterr().err
    assert "02" * 16 in err and "ModuleNotFoundError" in err and "tests.xxxxx" in err
