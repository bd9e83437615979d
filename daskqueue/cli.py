"""The ``daskqueue`` command line.

``daskqueue demo`` runs tasks through queues and consumers on a local cluster;
``daskqueue bench <name> [options]`` runs one of the benchmarks of a source checkout
(``benchmarks/<name>.py``, the same as ``python -m benchmarks.<name>``).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

__all__ = ["main"]


def _noop(x: int) -> int:
    return x


def _sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000)


def demo(args: argparse.Namespace) -> int:
    from distributed import Client, LocalCluster

    from daskqueue import ConsumerPool, QueuePool

    print(f"starting a LocalCluster: {args.workers} workers x 1 thread", flush=True)
    with LocalCluster(
        n_workers=args.workers, threads_per_worker=1, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        queue_pool = QueuePool(client, n_queues=args.workers)
        consumer_pool = ConsumerPool(client, queue_pool, n_consumers=args.workers)
        consumer_pool.start()
        started = time.perf_counter()
        if args.sleep_ms > 0:
            results = queue_pool.map(_sleep_ms, [args.sleep_ms] * args.tasks, progress=True)
        else:
            results = queue_pool.map(_noop, range(args.tasks), progress=True)
        elapsed = time.perf_counter() - started
        consumer_pool.close()
        queue_pool.close()
    if len(results) != args.tasks:
        # A lost or duplicated result is a bug, not a usage error: exit 1, not 2.
        print(f"daskqueue demo: {len(results):,} results for {args.tasks:,} tasks", file=sys.stderr)
        return 1
    print(f"{args.tasks:,} tasks in {elapsed:.2f} s: {args.tasks / elapsed:,.0f} tasks/s")
    return 0


def _benchmarks_root() -> Path | None:
    """The checkout holding ``benchmarks/``: the one this package was loaded from (a source
    checkout, or an install in development mode, ``pip install -e``). Never the current
    directory: a ``benchmarks/`` there would be code run as this user."""
    root = Path(__file__).resolve().parent.parent
    if (root / "benchmarks" / "common.py").is_file():
        return root
    return None


def benchmark_names(root: Path) -> list[str]:
    """The runnable benchmarks of ``root/benchmarks`` (every module but the helpers)."""
    helpers = {"__init__", "common", "tasks"}
    return sorted(p.stem for p in (root / "benchmarks").glob("*.py") if p.stem not in helpers)


def bench(args: argparse.Namespace) -> int:
    root = _benchmarks_root()
    if root is None:
        print("daskqueue bench: no benchmarks/ directory here. The benchmarks ship with the source, "
              "not the wheel: run this from a checkout of daskqueue (or install it with pip install -e).",
              file=sys.stderr)
        return 2
    names = benchmark_names(root)
    name = "run_all" if args.name == "all" else args.name
    if name not in names:
        print(f"daskqueue bench: unknown benchmark {args.name!r}; choose from: all, {', '.join(names)}",
              file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args.options], cwd=root, env=env).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="daskqueue", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log daskqueue at INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run N tasks through queues and consumers on a LocalCluster")
    p.add_argument("--tasks", type=int, default=1_000_000, help="number of tasks (default 1,000,000)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--sleep-ms", type=float, default=0.0, help="each task sleeps this long (default: no-op)")
    p.set_defaults(func=demo)
    p = sub.add_parser(
        "bench", help="run a benchmark of a source checkout: noop, submit, mixed, latency, memory, idle, "
        "durable, or all", description="Run benchmarks/<name>.py; options after the name go to it "
        "(see daskqueue bench <name> --help).",
    )
    p.add_argument("name", help="benchmark name, or 'all' for run_all")
    p.add_argument("options", nargs=argparse.REMAINDER, help="options for the benchmark")
    p.set_defaults(func=bench)
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO)
    if getattr(args, "tasks", 1) < 1 or getattr(args, "workers", 1) < 1:
        parser.error("--tasks and --workers must be >= 1")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
