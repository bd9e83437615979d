"""The ``daskqueue`` command line.

* ``daskqueue map MODULE:FUNC INPUT``: run ``FUNC(item)`` for each line of INPUT on a cluster,
  write the results as JSON lines; resumable with ``--durable DIR`` (see
  :mod:`daskqueue.mapjob`);
* ``daskqueue stats``: every pool registered on a cluster, its queues and consumers;
* ``daskqueue dead-letters list|replay|purge``: a pool's dead letters;
* ``daskqueue demo``: tasks through queues and consumers on a local cluster;
* ``daskqueue bench <name> [options]``: one of the benchmarks of the source checkout
  (``benchmarks/<name>.py``, the same as ``python -m benchmarks.<name>``);
* ``daskqueue --version``.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Sequence

__all__ = ["main"]


def _noop(x: int) -> int:
    return x


def _sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000)


def demo(args: argparse.Namespace) -> int:
    from distributed import Client, LocalCluster

    from daskqueue import ConsumerPool, QueuePool
    from daskqueue.queue.config import default_n_queues

    print(f"starting a LocalCluster: {args.workers} workers x 1 thread", flush=True)
    with LocalCluster(
        n_workers=args.workers, threads_per_worker=1, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        queue_pool = QueuePool(client, n_queues=default_n_queues(args.workers))  # workers x 1 thread
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


#: The longest ``daskqueue stats`` waits for the scheduler's answer.
STATS_TIMEOUT_S = 30.0


def _connect(address: str | None) -> Any:
    from distributed import Client

    if not address:
        address = os.environ.get("DASK_SCHEDULER_ADDRESS")
    if not address:
        raise SystemExit("daskqueue: give --scheduler ADDR (or set DASK_SCHEDULER_ADDRESS)")
    return Client(address, timeout="10s")


def _pool_stats(client: Any) -> list[dict[str, Any]]:
    from daskqueue import status

    async def collect(dask_scheduler: Any = None) -> list[dict[str, Any]]:
        return await status.collect_status(dask_scheduler)

    # Each worker is asked within 2 s on the scheduler; this bounds the scheduler's answer.
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(client.run_on_scheduler, collect).result(timeout=STATS_TIMEOUT_S)
    except FutureTimeout:
        raise SystemExit(f"daskqueue stats: the scheduler did not answer within {STATS_TIMEOUT_S:g} s") from None
    finally:
        pool.shutdown(wait=False)


def _print_stats(pools: list[dict[str, Any]], before: dict[tuple[str, Any], int] | None, dt: float,
                 quiet: bool = False) -> dict[tuple[str, Any], int]:
    """Print one table per pool (nothing if ``quiet``); return each queue's acks (for the
    next rates)."""
    if quiet:
        return {(p["name"], q["index"]): q.get("acks", 0) or 0 for p in pools for q in p["queues"]}
    acks: dict[tuple[str, Any], int] = {}
    if not pools:
        print("no daskqueue pools are registered on this cluster")
    for pool in pools:
        print(f"pool {pool['name']} ({pool.get('durability')}): {len(pool['queues'])} queues, "
              f"{len(pool['consumers'])} consumers")
        print(f"  {'queue':>5} {'state':<11} {'ready':>10} {'leased':>8} {'delayed':>8} {'dead':>7} "
              f"{'acked':>12} {'acks/s':>9}  worker")
        for q in pool["queues"]:
            key = (pool["name"], q["index"])
            acked = q.get("acks", 0) or 0
            acks[key] = acked
            rate = "" if before is None or key not in before else f"{(acked - before[key]) / dt:,.0f}"
            if q["state"] != "ok":
                print(f"  {q['index']:>5} {q['state']:<11} {'':>10} {'':>8} {'':>8} {'':>7} {'':>12} {'':>9}  "
                      f"{q['worker']} ({q.get('error', '')})")
                continue
            print(f"  {q['index']:>5} {'ok':<11} {q.get('ready', 0):>10,} {q.get('leased', 0):>8,} "
                  f"{q.get('delayed', 0):>8,} {q.get('dead', 0):>7,} {acked:>12,} {rate:>9}  {q['worker']}")
        running = [c for c in pool["consumers"] if c["state"] == "ok"]
        done = sum(c.get("done", 0) or 0 for c in running)
        failed = sum(c.get("failed", 0) or 0 for c in running)
        busy = sum(c.get("busy_slots", 0) or 0 for c in running)
        print(f"  consumers: {len(running)} reachable of {len(pool['consumers'])}, {busy} busy slots, "
              f"{done:,} tasks done, {failed:,} failed attempts")
    return acks


def stats(args: argparse.Namespace) -> int:
    client = _connect(args.scheduler)
    try:
        started = time.monotonic()
        before = _print_stats(_pool_stats(client), None, 1.0, quiet=True)  # the rates' first sample
        time.sleep(min(args.interval, 1.0))
        while True:
            pools = _pool_stats(client)
            now = time.monotonic()
            if args.watch:
                print("\033[2J\033[H", end="")
                print(time.strftime("%H:%M:%S"), f"(every {args.interval:g} s; Ctrl-C to stop)")
            before = _print_stats(pools, before, max(1e-9, now - started))
            started = now
            if not args.watch:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()


def _load_functions(blobs: dict[bytes, bytes]) -> dict[bytes, Any]:
    """The task functions of ``blobs`` (digest -> pickle) that this process can unpickle; each
    one it cannot (its module is not importable here, say) is reported on stderr, and its
    dead letters are listed without their function."""
    import pickle

    import cloudpickle

    funcs = {}
    for digest, blob in blobs.items():
        try:
            funcs[digest] = cloudpickle.loads(blob)
        except (ImportError, AttributeError, pickle.UnpicklingError, EOFError, TypeError, ValueError) as e:
            print(f"daskqueue dead-letters: function {digest.hex()} cannot be unpickled here "
                  f"({type(e).__name__}: {e}); its dead letters are listed without it", file=sys.stderr)
    return funcs


def dead_letters(args: argparse.Namespace) -> int:
    from daskqueue import registry
    from daskqueue.messages import make_id, split_id
    from daskqueue.results import dead_letter_of
    from daskqueue.serialize import dead_rows

    client = _connect(args.scheduler)
    try:
        pools = registry.registered_pools(client)
        if args.pool is None and len(pools) != 1:
            print(f"daskqueue dead-letters: give --pool, one of: {', '.join(sorted(pools)) or '(none registered)'}",
                  file=sys.stderr)
            return 2
        name = args.pool or next(iter(pools))
        if name not in pools:
            print(f"daskqueue dead-letters: no pool {name!r} (registered: {', '.join(sorted(pools))})", file=sys.stderr)
            return 2
        queues = {int(i): registry.actor_from_ref(ref) for i, ref in pools[name]["queues"].items()}
        wanted: dict[int, list[int]] | None = None
        if args.ids:
            wanted = {}
            for task_id in args.ids:
                q, seq = split_id(task_id)
                wanted.setdefault(q, []).append(seq)
        total = 0
        for q, handle in sorted(queues.items()):
            seqs = None if wanted is None else wanted.get(q)
            if wanted is not None and not seqs:
                continue
            if args.action == "list":
                rows = dead_rows(handle.dead_letters(args.limit, seqs).result(timeout=30))
                digests = sorted({r[5] for r in rows if r[5] is not None})
                funcs = _load_functions(handle.get_functions(digests).result(timeout=30)) if digests else {}
                blobs: dict[int, Any] = {}
                for row in rows:
                    d = dead_letter_of(q, row, funcs, blobs)
                    when = d.when.isoformat(timespec="seconds") if d.when else "?"
                    print(f"{d.task_id}\t{when}\tattempts={d.attempts}\t{d.error_type}: {d.message[:200]}"
                          f"\tpayload={d.payload!r:.200}")
                total += len(rows)
            elif args.action == "replay":
                runs = handle.replay_dead(seqs).result(timeout=60)
                for old, _, _, new in runs:
                    print(f"replayed {make_id(q, old)} as {make_id(q, new)}")
                total += len(runs)
            else:
                n_dead, _ = handle.purge(True, False, seqs).result(timeout=60)
                total += n_dead
        verb = {"list": "listed", "replay": "replayed", "purge": "purged"}[args.action]
        print(f"{total:,} dead letters {verb} in pool {name}", file=sys.stderr)
        return 0
    finally:
        client.close()


def map_command(args: argparse.Namespace) -> int:
    from daskqueue.mapjob import run_map

    return run_map(args)


def main(argv: Sequence[str] | None = None) -> int:
    from daskqueue._version import __version__

    parser = argparse.ArgumentParser(prog="daskqueue", description=__doc__)
    parser.add_argument("--version", action="version", version=f"daskqueue {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log daskqueue at INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("map", help="run FUNC(item) for each line of INPUT; results as JSON lines",
                       description="Run MODULE:FUNC on each item of INPUT (one per line; - for stdin) on a "
                       "Dask cluster (a LocalCluster unless --scheduler) and write one JSON line per item. "
                       "Exit status 1 if any item failed. With --durable DIR, running the same command "
                       "again after a crash resumes the job.")
    p.add_argument("func", metavar="MODULE:FUNC", help="the function, importable here (or a module of this directory)")
    p.add_argument("input", metavar="INPUT", help="a file of one item per line, or - for stdin")
    p.add_argument("--out", default=None, help="output file (default: stdout)")
    p.add_argument("--json", action="store_true", help="each line of INPUT is JSON (default: plain text)")
    p.add_argument("--unordered", action="store_true", help="write results as they finish, not in input order")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, help="the address of an existing cluster's scheduler")
    where.add_argument("--workers", type=int, default=2, help="workers of the LocalCluster started (default 2)")
    p.add_argument("--durable", default=None, metavar="DIR", help="keep the job in DIR: a rerun resumes it")
    p.add_argument("--queues", type=int, default=None,
                   help="queues (default: QueuePool's, from the cluster's worker threads; durable: 1)")
    p.add_argument("--max-retries", type=int, default=3, help="retries of a failing item (default 3)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S", help="interrupt an item after S seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func_=map_command)
    p = sub.add_parser("stats", help="the pools on a cluster: queues, ready, leased, dead, rates, consumers")
    p.add_argument("--scheduler", default=None, help="the scheduler's address (default: $DASK_SCHEDULER_ADDRESS)")
    p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.set_defaults(func_=stats)
    p = sub.add_parser("dead-letters", help="list, replay or purge a pool's dead letters")
    p.add_argument("action", choices=["list", "replay", "purge"])
    p.add_argument("--scheduler", default=None, help="the scheduler's address (default: $DASK_SCHEDULER_ADDRESS)")
    p.add_argument("--pool", default=None, help="the pool's name (needed when several are registered)")
    p.add_argument("--limit", type=int, default=None, help="list at most this many per queue")
    p.add_argument("--ids", type=int, nargs="+", default=None, help="only these task ids (list, replay)")
    p.set_defaults(func_=dead_letters)
    p = sub.add_parser("demo", help="run N tasks through queues and consumers on a LocalCluster")
    p.add_argument("--tasks", type=int, default=1_000_000, help="number of tasks (default 1,000,000)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--sleep-ms", type=float, default=0.0, help="each task sleeps this long (default: no-op)")
    p.set_defaults(func_=demo)
    p = sub.add_parser(
        "bench", help="run a benchmark of a source checkout: noop, submit, mixed, latency, memory, idle, "
        "durable, or all", description="Run benchmarks/<name>.py; options after the name go to it "
        "(see daskqueue bench <name> --help).",
    )
    p.add_argument("name", help="benchmark name, or 'all' for run_all")
    p.add_argument("options", nargs=argparse.REMAINDER, help="options for the benchmark")
    p.set_defaults(func_=bench)
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO)
    if getattr(args, "tasks", 1) < 1 or getattr(args, "workers", 1) < 1:
        parser.error("--tasks and --workers must be >= 1")
    if getattr(args, "queues", None) is not None and args.queues < 1:
        parser.error("--queues must be >= 1")
    if getattr(args, "time_limit", None) is not None and args.time_limit <= 0:
        parser.error("--time-limit must be > 0")
    return args.func_(args)


if __name__ == "__main__":
    sys.exit(main())
