"""latency: one task at a time on an idle cluster; submit-to-result and submit-to-start.

daskqueue: ``qp.submit(started_at, i)``, then ``cp.results()`` polled in a tight loop until the
id is there (submit-to-result); the task returns ``time.time()`` when it starts
(submit-to-start, against the client's wall clock just before ``submit``; same host).
If the package has ``ConsumerPool.result(id)`` (a long poll), its submit-to-result is measured
too. Baseline in the same run, interleaved with the daskqueue samples (rotating which goes
first): ``client.submit(started_at, i, pure=False).result()``.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row, summary


def one_daskqueue(qp: Any, cp: Any, i: int) -> tuple[float, float, float]:
    """``(submit_to_result_s, submit_to_start_s, submit_call_s)`` of one task."""
    wall0, t0 = time.time(), time.perf_counter()
    tid = qp.submit(tasks.started_at, i)
    t_sub = time.perf_counter()
    while True:
        results = cp.results()
        if tid in results:
            break
    t1 = time.perf_counter()
    return t1 - t0, results[tid] - wall0, t_sub - t0


def one_daskqueue_longpoll(qp: Any, cp: Any, i: int) -> float:
    """Submit-to-result of one task waited for with ``cp.result(id)`` (a long poll)."""
    t0 = time.perf_counter()
    cp.result(qp.submit(tasks.started_at, i), timeout=60)
    return time.perf_counter() - t0


def one_dask(client: Any, i: int) -> tuple[float, float]:
    """``(submit_to_result_s, submit_to_start_s)`` of one ``client.submit``."""
    wall0, t0 = time.time(), time.perf_counter()
    started = client.submit(tasks.started_at, i, pure=False).result()
    return time.perf_counter() - t0, started - wall0


def main() -> None:
    p = common.parser("latency", __doc__)
    p.add_argument("--n", type=positive, default=200, help="tasks per system")
    p.add_argument("--warmup", type=int, default=10, help="untimed tasks per system first")
    p.add_argument("--gap-ms", type=float, default=20.0,
                   help="pause between samples, so consumers are back to waiting on empty queues")
    args = p.parse_args()
    env = common.environment("latency")
    samples: dict[str, list[float]] = {k: [] for k in (
        "dq_result", "dq_start", "dq_submit_call", "dq_longpoll", "dask_result", "dask_start")}
    gap = args.gap_ms / 1000
    with local_cluster(args.workers, args.threads) as client:
        with daskqueue_pools(client) as (qp, cp):
            systems = ["dq", "dask"] + (["dq_longpoll"] if hasattr(cp, "result") else [])
            for i in range(args.warmup):
                one_daskqueue(qp, cp, -i)
                one_dask(client, -i)
                if "dq_longpoll" in systems:
                    one_daskqueue_longpoll(qp, cp, -i)
            log(f"{args.n} single tasks each through {', '.join(systems)}, interleaved")
            for i in range(args.n):
                k = i % len(systems)
                for system in systems[k:] + systems[:k]:
                    time.sleep(gap)
                    if system == "dq_longpoll":
                        samples["dq_longpoll"].append(one_daskqueue_longpoll(qp, cp, i))
                    elif system == "dq":
                        r, s, c = one_daskqueue(qp, cp, i)
                        samples["dq_result"].append(r)
                        samples["dq_start"].append(s)
                        samples["dq_submit_call"].append(c)
                    else:
                        r, s = one_dask(client, i)
                        samples["dask_result"].append(r)
                        samples["dask_start"].append(s)
            details: dict[str, Any] = {"queue_stats": [repr(s) for s in qp.stats()]}
    ms = {k: summary([x * 1000 for x in v]) for k, v in samples.items() if v}
    details.update({"summary_ms": ms, "samples_s": samples})
    rows = []
    for what, dq, dask in [("submit->result", "dq_result", "dask_result"),
                           ("submit->start", "dq_start", "dask_start")]:
        for q in ("p50", "p99"):
            rows.append(row(f"{what} {q}", ms[dq][q], "ms", f"client.submit {what} {q}", ms[dask][q],
                            better="lower"))
    if "dq_longpoll" in ms:
        for q in ("p50", "p99"):
            rows.append(row(f"submit->cp.result(id) {q}", ms["dq_longpoll"][q], "ms",
                            f"client.submit submit->result {q}", ms["dask_result"][q], better="lower"))
    rows.append(row("qp.submit call p50", ms["dq_submit_call"]["p50"], "ms",
                    "client.submit->result p50", ms["dask_result"]["p50"], better="lower"))
    common.report("latency", args, rows, details, env=env)


if __name__ == "__main__":
    main()
