"""noop: end-to-end rate of N no-op tasks through ``qp.map`` (submit included, results in order).

Baselines in the same run: ``client.map`` + ``client.gather`` of M no-op tasks with Dask's
defaults, the same on a fresh cluster with ``distributed.scheduler.worker-saturation: inf``,
and a local ``ProcessPoolExecutor(workers).map(noop, range(N), chunksize=1000)`` (no
distribution at all: the ceiling).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row, timed


def client_map_rate(client, m: int, warmup: int) -> dict:
    """``client.map(noop, range(m))`` + ``gather``, timed; results checked."""
    client.gather(client.map(tasks.noop, range(-warmup, 0)))
    seconds, out = timed(lambda: client.gather(client.map(tasks.noop, range(m))))
    assert out == list(range(m)), "client.map returned wrong results"
    return {"tasks": m, "seconds": seconds, "tasks_per_s": m / seconds}


def daskqueue_run(client, n: int, args, isolation: str) -> dict:
    """``qp.map(noop, range(n))`` on fresh pools, timed; results checked."""
    with daskqueue_pools(client, batch_size=args.batch_size, isolation=isolation) as (qp, cp):
        if args.warmup:
            qp.map(tasks.noop, range(args.warmup))
        seconds, out = timed(lambda: qp.map(tasks.noop, range(n)))
        ok = out == list(range(n))
        del out
        assert ok, "qp.map returned wrong or misordered results"
        return {
            "tasks": n, "seconds": seconds, "tasks_per_s": n / seconds, "isolation": isolation,
            "consumer_stats": [repr(s) for s in cp.stats()],
            "queue_stats": [repr(s) for s in qp.stats()],
        }


def main() -> None:
    p = common.parser("noop", __doc__)
    p.add_argument("--tasks", type=positive, default=1_000_000, help="N: daskqueue and process-pool tasks")
    p.add_argument("--baseline-tasks", type=positive, default=20_000, help="M: client.map tasks")
    p.add_argument("--warmup", type=int, default=1000, help="untimed tasks first, per system")
    p.add_argument("--batch-size", type=positive, default=None, help="fixed consumer batch size (default adapts)")
    p.add_argument("--isolation-runs", type=positive, default=2,
                   help="alternated runs of isolation='auto' and 'thread' (best of each kept)")
    args = p.parse_args()
    env = common.environment("noop")
    n, m = args.tasks, args.baseline_tasks
    details: dict = {}

    log(f"cluster {args.workers}x{args.threads}, Dask defaults: client.map of {m:,} no-ops")
    with local_cluster(args.workers, args.threads) as client:
        details["client_map_default"] = client_map_rate(client, m, min(args.warmup, 200))
        log(f"  {details['client_map_default']['tasks_per_s']:,.0f} tasks/s")
        # Consumers that share a worker with a queue run batches in a child process by
        # default (isolation="auto"); "thread" is the cost-free reference. Alternated, best
        # of the runs of each kept: this machine is noisy.
        for isolation in ["auto", "thread"] * args.isolation_runs:
            log(f"same cluster: daskqueue qp.map of {n:,} no-ops, isolation={isolation!r}")
            run = daskqueue_run(client, n, args, isolation)
            log(f"  {run['tasks_per_s']:,.0f} tasks/s")
            key = "daskqueue" if isolation == "auto" else "daskqueue_threads"
            details.setdefault(key + "_runs", []).append(run["tasks_per_s"])
            if run["tasks_per_s"] > details.get(key, {}).get("tasks_per_s", 0):
                details[key] = run

    log("fresh cluster, worker-saturation: inf: client.map")
    with local_cluster(args.workers, args.threads,
                       config={"distributed.scheduler.worker-saturation": float("inf")}) as client:
        details["client_map_saturation_inf"] = client_map_rate(client, m, min(args.warmup, 200))
    log(f"  {details['client_map_saturation_inf']['tasks_per_s']:,.0f} tasks/s")

    procs = args.workers * args.threads
    log(f"local ProcessPoolExecutor({procs}).map(noop, range({n:,}), chunksize=1000)")
    with ProcessPoolExecutor(procs) as ex:
        list(ex.map(tasks.noop, range(procs * 1000), chunksize=1000))  # start the processes
        seconds_pp, out = timed(lambda: list(ex.map(tasks.noop, range(n), chunksize=1000)))
        assert out == list(range(n))
        del out
    details["process_pool"] = {"tasks": n, "seconds": seconds_pp, "tasks_per_s": n / seconds_pp}

    dq = details["daskqueue"]["tasks_per_s"]
    rows = [
        row("no-op tasks/s, qp.map", dq, "tasks/s", "client.map (Dask defaults)",
            details["client_map_default"]["tasks_per_s"]),
        row("no-op tasks/s, qp.map", dq, "tasks/s", "client.map (worker-saturation inf)",
            details["client_map_saturation_inf"]["tasks_per_s"]),
        row("no-op tasks/s, qp.map", dq, "tasks/s", f"ProcessPoolExecutor({procs}) chunksize=1000",
            details["process_pool"]["tasks_per_s"], note="local ceiling, no distribution"),
        row("no-op tasks/s, qp.map, isolation='auto' (child processes)", dq, "tasks/s",
            "the same, isolation='thread'", details["daskqueue_threads"]["tasks_per_s"],
            note="cost of running user code out of the queues' processes"),
    ]
    common.report("noop", args, rows, details, env=env)


if __name__ == "__main__":
    main()
