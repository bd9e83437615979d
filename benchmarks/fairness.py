"""fairness: a late small type beside a large backlog, and a hard cap per type.

On 2 workers x 1 thread, a pool of 2 queues and one consumer per worker:

* latency: ``--bulk`` "bulk" tasks of ``--bulk-ms`` are queued first, then ``--interactive``
  "interactive" tasks of 1 ms; from their submission to each one's end, p50 / p99, with
  ``scheduler="fair"`` against ``"fifo"`` in the same run (where they wait for the backlog);
* cap: with ``scheduler="capped", type_caps={"bulk": 1}``, ``--cap-tasks`` bulk tasks; the
  most that ran at one instant, from their start and end times;
* throughput: ``--tput-tasks`` tasks of ``--bulk-ms`` with ``"capped"`` and a cap that is
  never hit (``type_caps={"other": 1}``) against ``"fifo"``, alternated ``--rounds`` times.
"""

from __future__ import annotations

import time

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row


def late_type_latency(client, scheduler: str, n_bulk: int, bulk_s: float, n_late: int) -> dict:
    with daskqueue_pools(client, n_queues=2, queue_options={"scheduler": scheduler}) as (qp, cp):
        qp.batch_submit([(tasks.sleep_span, bulk_s)] * n_bulk, type="bulk")
        time.sleep(1.0)  # the backlog is running on every consumer
        submitted = time.time()
        ids = qp.batch_submit([(tasks.sleep_span, 0.001)] * n_late, type="interactive")
        ends = [qp.result(i, timeout_s=3600)[1] for i in ids]
        latencies = [end - submitted for end in ends]
        left = sum(s.pending for s in qp.stats())
    return {"scheduler": scheduler, **common.summary(latencies), "bulk_left_when_done": left}


def max_overlap(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def capped_overlap(client, n: int, bulk_s: float) -> dict:
    options = {"scheduler": "capped", "type_caps": {"bulk": 1}}
    with daskqueue_pools(client, n_queues=2, queue_options=options) as (qp, cp):
        spans = qp.map(tasks.sleep_span, [bulk_s] * n, type="bulk", timeout_s=3600)
    return {"tasks": n, "max_running_at_once": max_overlap(spans)}


def throughput(client, scheduler: str, n: int, bulk_s: float) -> float:
    options = {"scheduler": scheduler}
    if scheduler == "capped":
        options["type_caps"] = {"other": 1}
    with daskqueue_pools(client, n_queues=2, queue_options=options) as (qp, cp):
        started = time.perf_counter()
        qp.map(tasks.sleep_span, [bulk_s] * n, type="bulk", timeout_s=3600)
        return n / (time.perf_counter() - started)


def main() -> None:
    p = common.parser("fairness", __doc__)
    p.add_argument("--bulk", type=positive, default=20_000, help="bulk tasks queued first")
    p.add_argument("--bulk-ms", type=float, default=20.0, help="duration of a bulk task")
    p.add_argument("--interactive", type=positive, default=200, help="late 1-ms tasks")
    p.add_argument("--cap-tasks", type=positive, default=200, help="bulk tasks under a cap of 1")
    p.add_argument("--tput-tasks", type=positive, default=2000, help="tasks per throughput run")
    p.add_argument("--rounds", type=positive, default=2, help="alternated throughput rounds")
    args = p.parse_args()
    env = common.environment("fairness")
    bulk_s = args.bulk_ms / 1000
    details: dict = {}
    with local_cluster(args.workers, args.threads) as client:
        for scheduler in ("fair", "fifo"):
            log(f"{scheduler}: {args.bulk:,} bulk tasks of {args.bulk_ms} ms, then {args.interactive} of 1 ms")
            details[scheduler] = late_type_latency(client, scheduler, args.bulk, bulk_s, args.interactive)
            log(f"  {details[scheduler]}")
        log(f"capped, type_caps={{'bulk': 1}}: {args.cap_tasks} bulk tasks")
        details["cap"] = capped_overlap(client, args.cap_tasks, bulk_s)
        log(f"  {details['cap']}")
        details["throughput"] = {"fifo": [], "capped": []}
        for r in range(args.rounds):
            for scheduler in ("fifo", "capped"):
                details["throughput"][scheduler].append(throughput(client, scheduler, args.tput_tasks, bulk_s))
                log(f"  round {r + 1} {scheduler}: {details['throughput'][scheduler][-1]:,.1f} tasks/s")
    best = {k: max(v) for k, v in details["throughput"].items()}
    rows = [
        row("interactive submit -> end p99 (s), fair", details["fair"]["p99"], "s",
            "same with fifo", details["fifo"]["p99"], better="lower", note="issue 12 target: fair p99 < 1 s"),
        row("interactive submit -> end p50 (s), fair", details["fair"]["p50"], "s",
            "same with fifo", details["fifo"]["p50"], better="lower"),
        row("bulk tasks running at once, capped bulk=1", details["cap"]["max_running_at_once"], "tasks",
            "the cap", 1, better="lower", note="must be <= 1"),
        row("throughput, capped with no cap hit (tasks/s)", best["capped"], "tasks/s",
            "fifo, same run", best["fifo"], note="issue 12 target >= 0.90x"),
    ]
    common.report("fairness", args, rows, details, env=env)


if __name__ == "__main__":
    main()
