"""urgent: short urgent tasks while every slot runs long CPU-bound ones.

On 2 workers x 1 thread, a pool of 2 queues and one consumer per worker with
``reserved_slots=1`` (urgent = ``priority >= 1``). A flood of ``--long`` CPU-bound tasks of
``--long-ms`` keeps both general slots busy; meanwhile ``--n`` single 1-ms tasks are
submitted one at a time with ``dq_priority=1`` and waited for (``cp.result(id)``).
Measured, each beside its baseline in the same run:

* urgent submit -> result p50 / p99, against the same urgent tasks on the idle cluster
  (target: p99 <= 3x idle);
* the long tasks' throughput while the urgent ones run, against the same flood with no
  urgent task (target >= 0.85x).
"""

from __future__ import annotations

import time

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row, summary


def urgent_latencies(qp, cp, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        cp.result(qp.submit(tasks.sleep_for, 0.001, dq_priority=1), timeout=120)
        out.append(time.perf_counter() - t0)
    return out


def flood(client, args, with_urgent: bool) -> dict:
    long_s = args.long_ms / 1000
    with daskqueue_pools(client, n_queues=2, reserved_slots=1) as (qp, cp):
        urgent_latencies(qp, cp, 10)  # warm up: functions known, children started
        idle = urgent_latencies(qp, cp, args.n) if with_urgent else []
        started = time.perf_counter()
        ids = qp.batch_submit([(tasks.burn_cpu, long_s)] * args.long)
        busy = urgent_latencies(qp, cp, args.n) if with_urgent else []
        cp.join(timeout=3600)
        seconds = time.perf_counter() - started
        assert len(ids) == args.long
    return {"long_tasks_per_s": args.long / seconds, "long_seconds": seconds,
            "idle": summary(idle) if idle else None, "busy": summary(busy) if busy else None}


def main() -> None:
    p = common.parser("urgent", __doc__)
    p.add_argument("--n", type=positive, default=200, help="urgent tasks, one at a time")
    p.add_argument("--long", type=positive, default=120, help="long CPU-bound tasks in the flood")
    p.add_argument("--long-ms", type=float, default=500.0, help="duration of a long task")
    p.add_argument("--rounds", type=positive, default=2, help="alternated rounds")
    args = p.parse_args()
    env = common.environment("urgent")
    details: dict = {"with_urgent": [], "without": []}
    with local_cluster(args.workers, args.threads) as client:
        for r in range(args.rounds):
            for kind, flag in (("with_urgent", True), ("without", False)):
                d = flood(client, args, flag)
                details[kind].append(d)
                extra = "" if not flag else (f", urgent p50/p99 idle {d['idle']['p50'] * 1000:.1f}/"
                                             f"{d['idle']['p99'] * 1000:.1f} ms, busy {d['busy']['p50'] * 1000:.1f}/"
                                             f"{d['busy']['p99'] * 1000:.1f} ms")
                log(f"round {r + 1} {kind}: long tasks {d['long_tasks_per_s']:.2f}/s{extra}")
    busy = [x for d in details["with_urgent"] for x in [d["busy"]]]
    idle = [d["idle"] for d in details["with_urgent"]]
    p99_busy, p99_idle = max(b["p99"] for b in busy), max(i["p99"] for i in idle)
    p50_busy, p50_idle = max(b["p50"] for b in busy), max(i["p50"] for i in idle)
    tput_with = sum(d["long_tasks_per_s"] for d in details["with_urgent"]) / args.rounds
    tput_without = sum(d["long_tasks_per_s"] for d in details["without"]) / args.rounds
    rows = [
        row("urgent submit -> result p99 (ms), slots busy", p99_busy * 1000, "ms",
            "same tasks, idle cluster", p99_idle * 1000, better="lower", note="issue 12 target <= 3x"),
        row("urgent submit -> result p50 (ms), slots busy", p50_busy * 1000, "ms",
            "same tasks, idle cluster", p50_idle * 1000, better="lower"),
        row("long tasks/s with urgent tasks beside", tput_with, "tasks/s",
            "same flood, no urgent task", tput_without, note="issue 12 target >= 0.85x"),
    ]
    common.report("urgent", args, rows, details, env=env)


if __name__ == "__main__":
    main()
