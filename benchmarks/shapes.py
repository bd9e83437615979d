"""shapes: issue 24's throughput targets, every way a user pushes many tasks, in one run.

On one 2 x 1 ``LocalCluster`` (one queue and one consumer per worker, the peers' shape), N
no-op tasks (default 1,000,000) go through each of:

* ``map``: ``qp.map(noop, range(N))`` (the baseline every ratio is against);
* ``imap`` and ``imap_unordered`` over a generator (``input_s``: what pulling that generator
  costs alone, measured apart: the user's own cost, paid by the client's main thread);
* ``imap_range``: ``imap`` over ``range(N)``, the input ``map`` gets (like for like);
* ``as_completed``: ``batch_submit`` in chunks (default 100,000), two in flight (``--in-flight``), the outcomes
  of each taken with ``cp.as_completed(ids)`` and dropped (what the README recommends for
  millions of tasks), with the client's RSS growth;
* ``batch_submit + join + results``: one ``batch_submit`` of N, ``cp.join()``,
  ``qp.results(clear=True)``;
* ``batch_submit`` alone: the call's own rate into a second pool that has no consumers.

The argument lists are built before each clock starts (they are the user's data). Every
shape's results are read and checked in C (``sum`` of the values; ``as_completed``'s pairs
through ``itemgetter``), so each pays the same small cost to read them and none pays a Python
loop body per item (a bare ``for k, v in enumerate(...)`` with a sum and a modulo costs 200 ms
per 1M on this machine: as much as a whole ``map``). The shapes run in a different order in
each round. Targets (issue 24): every shape >= 0.8x ``map``,
``batch_submit`` alone >= 2M tasks/s, ``map`` >= 1M/s.

``--ab OLD_TREE`` runs the whole measurement in subprocesses, alternating the package in
``OLD_TREE`` and this checkout's (``PYTHONPATH``), and prints new/old per shape.
"""

from __future__ import annotations

import argparse
import collections
import gc
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from operator import itemgetter

import psutil
from typing import Any, Callable

#: imap: results read between two RSS samples.
SAMPLE_EVERY = 250_000
second = itemgetter(1)  # the outcome of an ``(id, outcome)`` pair

SHAPES = ["map", "imap", "imap_range", "imap_unordered", "as_completed", "submit_join_results", "batch_submit"]


def noop(x: Any) -> Any:
    return x


def rss() -> int:
    """RSS after a full collection and ``malloc_trim``: what the process retains (before and
    after a shape)."""
    from benchmarks import tasks

    gc.collect()
    return tasks.rss_trimmed()


def rss_now() -> int:
    """RSS as it is, during a shape: an upper bound of what is retained. Not trimmed: a trim
    mid-stream hands freed pages back to the kernel, and the stream then pays the page faults
    of taking them again, a cost that ``map`` (never sampled) did not pay."""
    return psutil.Process().memory_info().rss


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks import tasks
    from benchmarks.common import daskqueue_pools, local_cluster
    from daskqueue import QueuePool

    n = args.n
    out: dict[str, Any] = {"n": n, "rounds": []}
    with local_cluster(args.workers, 1) as client:
        with daskqueue_pools(client, isolation=args.isolation) as (qp, cp):
            qp.map(tasks.noop, range(2000))

            def run_map() -> dict[str, Any]:
                t0 = time.perf_counter()
                res = qp.map(tasks.noop, range(n))
                total = sum(res)  # read as the streams' results are (in C)
                s = time.perf_counter() - t0
                assert len(res) == n and total == n * (n - 1) // 2
                return {"seconds": s}

            def run_imap(ordered: bool, generator: bool = True) -> Callable[[], dict[str, Any]]:
                def run() -> dict[str, Any]:
                    before = rss()
                    t0 = time.perf_counter()
                    it = qp.imap if ordered else qp.imap_unordered
                    total = 0
                    peak = 0
                    sampling = 0.0  # time spent reading RSS: not the stream's
                    # Consumed in C (islice + sum: 35 ms per 1M bare), every result checked by
                    # the sum; RSS read between slices of SAMPLE_EVERY. A Python loop body per
                    # item (the enumerate / += / % of stops 23-31: 200 ms per 1M bare, as much
                    # as map's whole run) measured the harness, not the stream.
                    stream = it(tasks.noop, (i for i in range(n)) if generator else range(n))
                    for _ in range(-(-n // SAMPLE_EVERY)):
                        total += sum(itertools.islice(stream, SAMPLE_EVERY))
                        a = time.perf_counter()
                        peak = max(peak, rss_now() - before)
                        sampling += time.perf_counter() - a
                    assert next(stream, None) is None
                    s = time.perf_counter() - t0 - sampling
                    assert total == n * (n - 1) // 2
                    got = {"seconds": s, "rss_growth_mib": round(max(peak, rss() - before) / 2**20, 1)}
                    if generator:
                        a = time.perf_counter()
                        collections.deque((i for i in range(n)), 0)
                        got["input_s"] = round(time.perf_counter() - a, 3)
                    return got
                return run

            def run_as_completed() -> dict[str, Any]:
                chunk = min(args.chunk, n)
                batches = [[(tasks.noop, i) for i in range(a, min(n, a + chunk))] for a in range(0, n, chunk)]
                before = rss()
                peak = 0
                t0 = time.perf_counter()
                done = 0
                sampling = 0.0  # time spent reading RSS: not the shape's
                pending: list[list[int]] = []  # the chunks submitted and not yet taken
                for k, batch in enumerate(batches):
                    pending.append(qp.batch_submit(batch))
                    if len(pending) >= args.in_flight:
                        done += sum(map(second, cp.as_completed(pending.pop(0), timeout=600)))
                        if k % 3 == 0:
                            a = time.perf_counter()
                            peak = max(peak, rss_now() - before)
                            sampling += time.perf_counter() - a
                for ids in pending:
                    done += sum(map(second, cp.as_completed(ids, timeout=600)))
                s = time.perf_counter() - t0 - sampling
                assert done == n * (n - 1) // 2  # every outcome, once: the values' sum
                del batches
                return {"seconds": s, "rss_growth_mib": round(max(peak, rss() - before) / 2**20, 1)}

            def run_submit_join_results() -> dict[str, Any]:
                batch = [(tasks.noop, i) for i in range(n)]
                t0 = time.perf_counter()
                ids = qp.batch_submit(batch)
                cp.join(timeout=600)
                res = qp.results(clear=True)
                s = time.perf_counter() - t0
                assert len(ids) == n and len(res) >= n and res[ids[-1]] == n - 1
                return {"seconds": s}

            def run_batch_submit() -> dict[str, Any]:
                batch = [(tasks.noop, i) for i in range(n)]
                bare = QueuePool(client, n_queues=args.workers)
                try:
                    bare.batch_submit(batch[:1000])
                    t0 = time.perf_counter()
                    ids = bare.batch_submit(batch)
                    s = time.perf_counter() - t0
                    assert len(ids) == n
                finally:
                    bare.close()
                return {"seconds": s}

            runs = {"map": run_map, "imap": run_imap(True), "imap_range": run_imap(True, generator=False),
                    "imap_unordered": run_imap(False),
                    "as_completed": run_as_completed, "submit_join_results": run_submit_join_results,
                    "batch_submit": run_batch_submit}
            wanted = [s for s in SHAPES if s in args.shapes.split(",")]
            for r in range(args.rounds):
                order = wanted[r % len(wanted):] + wanted[: r % len(wanted)]
                got = {}
                for name in order:
                    res = runs[name]()
                    res["per_s"] = round(n / res["seconds"])
                    got[name] = res
                    extra = f"  (its generator alone: {res['input_s']:.3f} s)" if "input_s" in res else ""
                    print(f"  round {r + 1} {name:20s} {res['per_s']:>10,}/s{extra}", file=sys.stderr, flush=True)
                out["rounds"].append(got)
    return out


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: per shape, tasks/s per tree and round, ratio to map in the same round, new/old."""
    lines = ["| shape | " + " | ".join(f"{t} tasks/s (x map)" for t in results) + " | new / old |",
             "|---|" + "---|" * (len(results) + 1)]
    trees = list(results)
    for shape in SHAPES:
        cells = []
        rates: dict[str, list[int]] = {}
        for t in trees:
            parts = []
            for rnd in results[t]:
                for got in rnd["rounds"]:
                    if shape in got:
                        rate = got[shape]["per_s"]
                        rates.setdefault(t, []).append(rate)
                        ratio = f" ({rate / got['map']['per_s']:.2f}x)" if "map" in got and shape != "map" else ""
                        mem = f", {got[shape]['rss_growth_mib']} MiB" if "rss_growth_mib" in got[shape] else ""
                        parts.append(f"{rate:,}{ratio}{mem}")
            cells.append(" / ".join(parts) or "-")
        if len(trees) == 2 and all(rates.get(t) for t in trees):
            old, new = (sorted(rates[t])[len(rates[t]) // 2] for t in trees)
            cells.append(f"{new / old:.2f}x")
        else:
            cells.append("-")
        if any(c != "-" for c in cells[:-1]):
            lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--chunk", type=int, default=100_000, help="as_completed: batch_submit chunk")
    p.add_argument("--in-flight", type=int, default=2, help="as_completed: chunks submitted and not yet taken")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--isolation", default="auto")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--ab", metavar="OLD_TREE", help="alternate with the package in OLD_TREE")
    p.add_argument("--ab-runs", type=int, default=2, help="with --ab: runs per tree, alternated")
    p.add_argument("--json", help="write the raw figures here")
    args = p.parse_args()
    if not args.ab:
        out = measure(args)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        print(json.dumps(out))
        return
    here = str(Path(__file__).resolve().parents[1])
    trees = {"old": str(Path(args.ab).resolve()), "new": here}
    results: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    passthrough = [a for a in sys.argv[1:]]
    i = passthrough.index("--ab")
    del passthrough[i : i + 2]
    for k in range(args.ab_runs):
        for name in (["old", "new"] if k % 2 == 0 else ["new", "old"]):
            env = dict(os.environ, PYTHONPATH=trees[name])
            print(f"{name} ({trees[name]}), run {k + 1}, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
            got = subprocess.run([sys.executable, __file__, *passthrough], env=env, cwd=trees[name],
                                 capture_output=True, text=True, timeout=3600)
            sys.stderr.write("".join(line + "\n" for line in got.stderr.splitlines() if "round" in line))
            if got.returncode:
                sys.exit(f"{name} failed:\n{got.stderr[-3000:]}")
            results[name].append(json.loads(got.stdout.strip().splitlines()[-1]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
