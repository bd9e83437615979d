"""memory: queue-actor memory per waiting message.

Put N small messages (default 1,000,000 tasks ``(noop, i)``; ``--kind raw`` puts the ints with
``put_many``) with no consumers; the growth of the workers' RSS (after ``gc.collect()`` and
``malloc_trim``), summed over the workers, divided by N.

Baseline in the same run (on a fresh cluster first): the scheduler process's RSS growth for
M (default 20,000) pending ``client.map``-ed tasks that depend on a task pinned to a worker
that does not exist, per task. A LocalCluster's scheduler shares the client's process, so the
client's futures are in that figure too. Dask's documented ~16 KiB per task is a second
reference. (``SubprocessCluster`` would isolate the scheduler, but hung here in
``Event.set``/startup, so it is not used.)
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row

DASK_DOC_BYTES_PER_TASK = 16 * 1024
NO_SUCH_WORKER = "tcp://192.0.2.1:1"  # TEST-NET-1: never a worker


def dask_scheduler_bytes_per_task(client: Any, m: int) -> dict[str, Any]:
    """Scheduler-process RSS growth per pending task, for ``m`` tasks that depend on a task
    pinned to a worker that does not exist (so it never runs and they all wait)."""
    client.gather(client.map(tasks.noop, range(100)))
    before = client.run_on_scheduler(tasks.rss_trimmed)
    blocker = client.submit(tasks.noop, 0, workers=[NO_SUCH_WORKER], allow_other_workers=False, pure=False)
    futures = client.map(tasks.noop_after, range(m), dep=blocker, pure=False)
    deadline = time.monotonic() + 300
    while client.run_on_scheduler(tasks.scheduler_task_count) < m + 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the scheduler did not receive every task")
        time.sleep(0.1)
    after = client.run_on_scheduler(tasks.rss_trimmed)
    client.cancel(futures + [blocker])
    return {"tasks": m, "rss_before": before, "rss_after": after, "bytes_per_task": (after - before) / m,
            "where": "LocalCluster: the scheduler runs in the client process, so the client's "
                     "futures are counted too"}


def main() -> None:
    p = common.parser("memory", __doc__)
    p.add_argument("--messages", type=positive, default=1_000_000, help="N messages put")
    p.add_argument("--kind", choices=["task", "raw"], default="task",
                   help="task: batch_submit((noop, i)); raw: put_many(range(N))")
    p.add_argument("--dask-tasks", type=int, default=20_000, help="M pending Dask tasks (0: skip)")
    args = p.parse_args()
    env = common.environment("memory")
    n = args.messages
    details: dict[str, Any] = {}
    if args.dask_tasks > 0:
        log(f"Dask baseline: scheduler RSS growth for {args.dask_tasks:,} pending tasks")
        with local_cluster(args.workers, args.threads) as client:
            details["dask"] = dask_scheduler_bytes_per_task(client, args.dask_tasks)
        log(f"  {details['dask']['bytes_per_task']:,.0f} B/task")

    log(f"daskqueue: {n:,} {args.kind} messages put, no consumers")
    with local_cluster(args.workers, args.threads) as client:
        with daskqueue_pools(client, n_consumers=0) as (qp, _):
            qp.batch_submit([(tasks.noop, -1)])  # queues started, function known
            before, before_raw = client.run(tasks.rss_trimmed), client.run(tasks.rss)
            items = list(range(n))
            t0 = time.perf_counter()
            ids = qp.batch_submit([(tasks.noop, i) for i in items]) if args.kind == "task" else qp.put_many(items)
            put_s = time.perf_counter() - t0
            after_raw, after = client.run(tasks.rss), client.run(tasks.rss_trimmed)
            stats = qp.stats()
            assert len(ids) == n and sum(s.ready for s in stats) == n + 1, stats
            del ids, items
    delta = sum(after[w] - before[w] for w in after)
    details["daskqueue"] = {
        "messages": n, "kind": args.kind, "put_s": put_s, "rss_before": before, "rss_after": after,
        "rss_before_untrimmed": before_raw, "rss_after_untrimmed": after_raw, "rss_growth": delta,
        "bytes_per_message": delta / n,
        "bytes_per_message_untrimmed": sum(after_raw[w] - before_raw[w] for w in after_raw) / n,
        "queue_stats": [repr(s) for s in stats],
    }
    log(f"  {delta / n:,.1f} B/message (RSS growth {delta / 2**20:,.1f} MiB)")
    per = delta / n
    rows = []
    if "dask" in details:
        rows.append(row("queue RSS per waiting message", per, "B", "Dask scheduler(+client) RSS per pending task",
                        details["dask"]["bytes_per_task"], better="lower"))
    rows.append(row("queue RSS per waiting message", per, "B", "Dask docs: ~16 KiB per task",
                    DASK_DOC_BYTES_PER_TASK, better="lower", note="documented constant, not measured"))
    common.report("memory", args, rows, details, env=env)


if __name__ == "__main__":
    main()
