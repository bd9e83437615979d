"""mixed: a document-pages workload of short tasks with a rare long tail; makespan.

N tasks (default 20,000) sleep log-normal durations (mean 1 ms) except a rare tail (default
0.1%) that sleeps 200 ms; fixed seed. Makespan of ``qp.map`` with fixed ``batch_size=1``, fixed
``batch_size=1000`` and the adaptive default, against, in the same run: the ideal (sum of
durations / total threads), ``client.map(..., pure=False)`` + ``gather`` of the same tasks, and
a local ``ThreadPoolExecutor`` with as many threads (what ``time.sleep`` really gives here).

Each task returns how long its sleep really took. ``time.sleep`` overshoots by tens of
microseconds on this machine, about 10% of a 1 ms task, so the nominal ideal is out of reach
for any system; each system's *measured ideal* (the sum of its tasks' real durations /
threads) is the floor it could have reached, and makespan / measured ideal is the share of
time lost to scheduling, fetching and settling.
"""

from __future__ import annotations

import math
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row, timed


def durations(n: int, *, mean_s: float, sigma: float, tail_fraction: float, tail_s: float,
              seed: int) -> list[float]:
    """Log-normal durations with the given mean, and ``tail_fraction`` of them set to ``tail_s``."""
    rng = random.Random(seed)
    mu = math.log(mean_s) - sigma**2 / 2
    out = [rng.lognormvariate(mu, sigma) for _ in range(n)]
    for i in rng.sample(range(n), round(n * tail_fraction)):
        out[i] = tail_s
    return out


def main() -> None:
    p = common.parser("mixed", __doc__)
    p.add_argument("--tasks", type=positive, default=20_000)
    p.add_argument("--mean-ms", type=float, default=1.0, help="mean of the log-normal part")
    p.add_argument("--sigma", type=float, default=1.0, help="sigma of the log-normal (of log seconds)")
    p.add_argument("--tail-fraction", type=float, default=0.001, help="fraction of tail tasks")
    p.add_argument("--tail-ms", type=float, default=200.0, help="duration of a tail task")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--batch-sizes", default="1,1000,adaptive",
                   help="daskqueue variants: comma-separated fixed sizes and/or 'adaptive'")
    p.add_argument("--isolation", choices=["auto", "thread", "process"], default="auto",
                   help="where daskqueue's consumers run tasks ('auto': a child process, as a queue "
                        "shares each worker)")
    args = p.parse_args()
    env = common.environment("mixed")
    work = durations(args.tasks, mean_s=args.mean_ms / 1000, sigma=args.sigma,
                     tail_fraction=args.tail_fraction, tail_s=args.tail_ms / 1000, seed=args.seed)
    threads = args.workers * args.threads
    total = sum(work)
    ideal = total / threads
    details: dict[str, Any] = {
        "work": {"tasks": len(work), "sum_s": total, "mean_ms": total / len(work) * 1000,
                 "p50_ms": common.percentile(work, 50) * 1000, "p99_ms": common.percentile(work, 99) * 1000,
                 "tail_tasks": sum(1 for d in work if d == args.tail_ms / 1000), "threads": threads},
        "ideal_s": ideal,
    }
    log(f"{len(work):,} tasks, sum {total:.2f} s, ideal makespan on {threads} threads {ideal:.2f} s")
    variants = [None if v.strip() == "adaptive" else int(v) for v in args.batch_sizes.split(",")]

    with local_cluster(args.workers, args.threads) as client:
        client.gather(client.map(tasks.noop, range(100)))
        log("client.map(sleep_for, durations, pure=False)")
        seconds, out = timed(lambda: client.gather(client.map(tasks.sleep_timed, work, pure=False)))
        assert len(out) == len(work)
        details["client_map"] = {"makespan_s": seconds, "measured_ideal_s": sum(out) / threads}
        log(f"  {seconds:.2f} s")
        for bs in variants:
            label = "adaptive" if bs is None else f"batch_size={bs}"
            log(f"daskqueue qp.map, {label}")
            # no warm-up map: it would teach the adaptive batch size no-op timings
            with daskqueue_pools(client, batch_size=bs, isolation=args.isolation) as (qp, cp):
                seconds, out = timed(lambda: qp.map(tasks.sleep_timed, work))
                assert len(out) == len(work)
                details[f"daskqueue_{label}"] = {
                    "makespan_s": seconds, "measured_ideal_s": sum(out) / threads,
                    "consumer_stats": [repr(s) for s in cp.stats()]}
            log(f"  {seconds:.2f} s")

    log(f"local ThreadPoolExecutor({threads}) running the same sleeps")
    with ThreadPoolExecutor(threads) as ex:
        seconds, out = timed(lambda: list(ex.map(tasks.sleep_timed, work)))
    details["local_threads"] = {"makespan_s": seconds, "measured_ideal_s": sum(out) / threads}
    log(f"  {seconds:.2f} s")

    systems = [("local threads", details["local_threads"]), ("client.map", details["client_map"])]
    systems += [(k.removeprefix("daskqueue_"), v) for k, v in details.items() if k.startswith("daskqueue_")]
    print("\n" + common.render_table(
        ["system", "makespan s", "x ideal", "measured ideal s", "x measured ideal"],
        [["ideal (sum / threads)", f"{ideal:.2f}", "1.00x", "", ""]]
        + [[s, f"{v['makespan_s']:.2f}", f"{v['makespan_s'] / ideal:.2f}x", f"{v['measured_ideal_s']:.2f}",
            f"{v['makespan_s'] / v['measured_ideal_s']:.3f}x"] for s, v in systems]))
    rows = []
    for key in [k for k in details if k.startswith("daskqueue_")]:
        label, t = key.removeprefix("daskqueue_"), details[key]["makespan_s"]
        rows.append(row(f"makespan, {label}", t, "s", "ideal (sum/threads)", ideal, better="lower"))
        rows.append(row(f"makespan, {label}", t, "s", "measured ideal (real sleeps / threads)",
                        details[key]["measured_ideal_s"], better="lower"))
        rows.append(row(f"makespan, {label}", t, "s", "client.map", details["client_map"]["makespan_s"],
                        better="lower"))
        rows.append(row(f"makespan, {label}", t, "s", f"local ThreadPoolExecutor({threads})",
                        details["local_threads"]["makespan_s"], better="lower"))
    common.report("mixed", args, rows, details, env=env)


if __name__ == "__main__":
    main()
