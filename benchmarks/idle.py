"""idle: worker CPU while consumers wait on empty queues.

For ``--seconds`` (default 10): the CPU time (user + system, psutil) the worker processes use,
as a percentage of one core (summed over workers, and per worker), with a QueuePool and
started ConsumerPool whose queues are empty; and what daskqueue adds per worker, the
difference. An idle Dask worker alone (heartbeats, system monitor) already uses a few percent. Baseline in the same run, on the same cluster, just before: the same
window with no daskqueue actors. The scheduler's process (the benchmark's own, in a
LocalCluster) is reported too.

Then the grid (issue 12): on ``--grid-workers`` workers, for each ``QxC`` point, Q queues and C
consumers idle: the CPU daskqueue adds (all workers, % of one core), the get_batch calls per
second, and the submit -> result latency of single tasks put while every consumer is idle.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, row


def cpu_window(client: Any, seconds: float) -> dict[str, Any]:
    """CPU% of every worker process and of the scheduler's process over ``seconds``."""
    w0, s0 = client.run(tasks.cpu_seconds), client.run_on_scheduler(tasks.cpu_seconds)
    time.sleep(seconds)
    w1, s1 = client.run(tasks.cpu_seconds), client.run_on_scheduler(tasks.cpu_seconds)

    def pct(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
        return 100 * ((b[0] - a[0]) + (b[1] - a[1])) / (b[2] - a[2])

    workers = {w: pct(w0[w], w1[w]) for w in w1 if w in w0}
    return {"seconds": seconds, "workers_pct": workers, "workers_total_pct": sum(workers.values()),
            "scheduler_process_pct": pct(s0, s1)}


def grid_point(client: Any, n_queues: int, n_consumers: int, args: Any) -> dict[str, Any]:
    """Worker CPU with ``n_queues`` x ``n_consumers`` idle, get_batch calls per second, and
    submit -> result latency of single tasks put while every consumer is idle."""
    with daskqueue_pools(client, n_queues=n_queues, n_consumers=n_consumers) as (qp, cp):
        qp.map(tasks.noop, range(10 * n_queues))
        time.sleep(args.settle)
        g0 = sum(s.get_calls for s in qp.stats())
        window = cpu_window(client, args.seconds)
        g1 = sum(s.get_calls for s in qp.stats())
        latencies = []
        for i in range(args.probes):  # one task at a time, each after an idle gap
            time.sleep(0.05)
            t0 = time.perf_counter()
            cp.result(qp.submit(tasks.noop, i), timeout=60)
            latencies.append(time.perf_counter() - t0)
    window["get_batch_calls_per_s"] = (g1 - g0) / args.seconds
    window["latency"] = common.summary(latencies)
    return window


def run_grid(args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with local_cluster(args.grid_workers, args.threads) as client:
        client.gather(client.map(tasks.noop, range(20)))
        time.sleep(args.settle)
        out["baseline"] = cpu_window(client, args.seconds)
        log(f"grid: {args.grid_workers} idle workers, no actors: {out['baseline']['workers_total_pct']:.2f}% CPU")
        for point in args.grid.split(","):
            q, c = (int(x) for x in point.split("x"))
            d = out[point] = grid_point(client, q, c, args)
            d["added_pct"] = d["workers_total_pct"] - out["baseline"]["workers_total_pct"]
            log(f"  {q} queues x {c} consumers: adds {d['added_pct']:.2f}% of a core, "
                f"{d['get_batch_calls_per_s']:.0f} get_batch/s, submit -> result p50 "
                f"{d['latency']['p50'] * 1000:.1f} ms, p99 {d['latency']['p99'] * 1000:.1f} ms")
    return out


def main() -> None:
    p = common.parser("idle", __doc__)
    p.add_argument("--seconds", type=float, default=10.0, help="length of each measured window")
    p.add_argument("--settle", type=float, default=2.0, help="pause before each window")
    p.add_argument("--grid", default="1x4,4x16,16x32", help="queues x consumers points, idle")
    p.add_argument("--grid-workers", type=int, default=4, help="workers of the grid's cluster")
    p.add_argument("--probes", type=int, default=50, help="single tasks timed per grid point")
    args = p.parse_args()
    env = common.environment("idle")
    details: dict[str, Any] = {}
    with local_cluster(args.workers, args.threads) as client:
        client.gather(client.map(tasks.noop, range(20)))
        time.sleep(args.settle)
        log(f"idle cluster, no daskqueue actors: {args.seconds:g} s")
        details["baseline"] = cpu_window(client, args.seconds)
        log(f"  workers {details['baseline']['workers_total_pct']:.2f}% CPU")
        with daskqueue_pools(client) as (qp, cp):
            qp.map(tasks.noop, range(100))  # every consumer has run; now the queues are empty
            time.sleep(args.settle)
            log(f"consumers started, queues empty: {args.seconds:g} s")
            g0 = sum(s.get_calls for s in qp.stats())
            details["daskqueue"] = cpu_window(client, args.seconds)
            g1 = sum(s.get_calls for s in qp.stats())
            details["daskqueue"]["get_batch_calls_per_s"] = (g1 - g0) / args.seconds
            details["daskqueue"]["consumer_stats"] = [repr(s) for s in cp.stats()]
        log(f"  workers {details['daskqueue']['workers_total_pct']:.2f}% CPU, "
            f"{details['daskqueue']['get_batch_calls_per_s']:.1f} get_batch calls/s")
    details["grid"] = run_grid(args) if args.grid else {}
    b, d = details["baseline"], details["daskqueue"]
    n = max(1, len(d["workers_pct"]))
    per_worker, per_worker_base = d["workers_total_pct"] / n, b["workers_total_pct"] / n
    details["added_pct_per_worker"] = per_worker - per_worker_base
    rows = [
        row("worker CPU, consumers idle", d["workers_total_pct"], "% of a core",
            "idle cluster, no actors", b["workers_total_pct"], better="lower"),
        row("CPU per worker, consumers idle", per_worker, "% of a core",
            "idle worker, no actors", per_worker_base, better="lower"),
        row("CPU daskqueue adds per worker", per_worker - per_worker_base, "% of a core",
            "idle worker, no actors", per_worker_base, better="lower"),
        row("scheduler process CPU, consumers idle", d["scheduler_process_pct"], "% of a core",
            "idle cluster, no actors", b["scheduler_process_pct"], better="lower"),
    ]
    for point, g in details["grid"].items():
        if point != "baseline":
            rows.append(row(f"CPU daskqueue adds, {point} idle on {args.grid_workers} workers", g["added_pct"],
                            "% of a core", "idle workers, no actors", details["grid"]["baseline"]["workers_total_pct"],
                            better="lower", note="issue 12 target: 16x32 <= 3%"))
            rows.append(row(f"submit -> result p50, {point} idle (ms)", g["latency"]["p50"] * 1000, "ms",
                            "p99", g["latency"]["p99"] * 1000, better="lower"))
    common.report("idle", args, rows, details, env=env)


if __name__ == "__main__":
    main()
