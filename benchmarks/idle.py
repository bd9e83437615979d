"""idle: worker CPU while consumers wait on empty queues.

For ``--seconds`` (default 10): the CPU time (user + system, psutil) the worker processes use,
as a percentage of one core (summed over workers, and per worker), with a QueuePool and
started ConsumerPool whose queues are empty; and what daskqueue adds per worker, the
difference. An idle Dask worker alone (heartbeats, system monitor) already uses a few percent. Baseline in the same run, on the same cluster, just before: the same
window with no daskqueue actors. The scheduler's process (the benchmark's own, in a
LocalCluster) is reported too.
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


def main() -> None:
    p = common.parser("idle", __doc__)
    p.add_argument("--seconds", type=float, default=10.0, help="length of each measured window")
    p.add_argument("--settle", type=float, default=2.0, help="pause before each window")
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
    common.report("idle", args, rows, details, env=env)


if __name__ == "__main__":
    main()
