"""direct: what calling the queues' workers directly buys, against the scheduler's proxy.

A Dask actor handle on a client calls its worker through the scheduler unless the client has
``direct_to_workers=True``; ``QueuePool`` calls the workers directly by default. On one
cluster, alternating (rounds x 2 settings, so drift hits both alike): ``QueuePool`` with
``direct_to_workers=True`` and with ``False`` (the proxy, as before), each measured on
single-task latency (``cp.result(qp.submit(...))`` after an idle gap, p50) and on
``qp.map`` throughput of no-ops.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row


def latency_p50_ms(qp: Any, cp: Any, n: int, gap_s: float) -> float:
    samples = []
    for i in range(n):
        time.sleep(gap_s)
        t0 = time.perf_counter()
        cp.result(qp.submit(tasks.noop, i), timeout=60)
        samples.append(time.perf_counter() - t0)
    return common.percentile(samples, 50) * 1000


def map_rate(qp: Any, n: int) -> float:
    t0 = time.perf_counter()
    out = qp.map(tasks.noop, range(n))
    assert len(out) == n
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = common.parser("direct", __doc__)
    p.add_argument("--rounds", type=positive, default=3)
    p.add_argument("--n", type=positive, default=100, help="latency samples per round")
    p.add_argument("--gap-ms", type=float, default=20.0, help="idle gap before each latency sample")
    p.add_argument("--map-tasks", type=positive, default=300_000)
    args = p.parse_args()
    env = common.environment("direct")
    got: dict[bool, dict[str, list[float]]] = {d: {"latency_ms": [], "map_rate": []} for d in (True, False)}
    with local_cluster(args.workers, args.threads) as client:
        for r in range(args.rounds):
            for direct in ((True, False) if r % 2 == 0 else (False, True)):
                with daskqueue_pools(client, queue_options={"direct_to_workers": direct}) as (qp, cp):
                    qp.map(tasks.noop, range(1000))  # warm up
                    got[direct]["latency_ms"].append(latency_p50_ms(qp, cp, args.n, args.gap_ms / 1000))
                    got[direct]["map_rate"].append(map_rate(qp, args.map_tasks))
                log(f"round {r} direct={direct}: p50 {got[direct]['latency_ms'][-1]:.2f} ms, "
                    f"map {got[direct]['map_rate'][-1]:,.0f} tasks/s")
    med = {d: {k: common.percentile(v, 50) for k, v in got[d].items()} for d in got}
    rows = [
        row("submit->cp.result(id) p50, direct", med[True]["latency_ms"], "ms",
            "same, through the scheduler", med[False]["latency_ms"], better="lower"),
        row(f"qp.map of {args.map_tasks:,} no-ops, direct", med[True]["map_rate"], "tasks/s",
            "same, through the scheduler", med[False]["map_rate"]),
    ]
    common.report("direct", args, rows, {"per_round": got, "median": med}, env=env)


if __name__ == "__main__":
    main()
