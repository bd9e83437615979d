"""memory: queue-actor memory per waiting message.

Put N small messages (default 1,000,000 tasks ``(noop, i)``; ``--kind raw`` puts the ints with
``put_many``) with no consumers; the growth of the workers' RSS (after ``gc.collect()`` and
``malloc_trim``), summed over the workers, divided by N.

Baseline in the same run: the Dask scheduler's RSS growth for M (default 20,000) pending
``client.map``-ed tasks that wait on a blocker task (held on a ``distributed.Event``), per
task; the scheduler runs in its own process (``SubprocessCluster``) so client-side futures
are not counted. Dask's documented figure (~16 KiB per task) is a second reference.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row

DASK_DOC_BYTES_PER_TASK = 16 * 1024


def dask_scheduler_bytes_per_task(m: int, n_workers: int, threads: int) -> dict[str, Any]:
    """Scheduler RSS growth per pending task, for ``m`` tasks blocked behind one task."""
    from distributed import Client, Event

    try:
        from distributed.deploy.subprocess import SubprocessCluster

        cluster = SubprocessCluster(n_workers=n_workers, threads_per_worker=threads, dashboard_address=None)
        where = "SubprocessCluster: scheduler in its own process"
    except Exception as e:  # fall back to the in-process scheduler (client futures counted too)
        log(f"  SubprocessCluster unavailable ({e}); using a LocalCluster")
        cluster, where = None, "LocalCluster: scheduler in the client process (futures counted)"
    with (cluster if cluster is not None else local_cluster(n_workers, threads)) as c:
        client = Client(c) if cluster is not None else c
        try:
            client.wait_for_workers(n_workers, timeout=120)
            client.gather(client.map(tasks.noop, range(100)))
            before = client.run_on_scheduler(tasks.rss_trimmed)
            name = f"daskqueue-bench-{uuid.uuid4().hex}"
            blocker = client.submit(tasks.wait_event, name, pure=False)
            futures = client.map(tasks.noop_after, range(m), dep=blocker, pure=False)
            deadline = time.monotonic() + 300
            while client.run_on_scheduler(tasks.scheduler_task_count) < m + 1:
                if time.monotonic() > deadline:
                    raise TimeoutError("the scheduler did not receive every task")
                time.sleep(0.1)
            after = client.run_on_scheduler(tasks.rss_trimmed)
            client.cancel(futures)
            Event(name, client=client).set()  # let the blocker finish
            client.cancel([blocker])
            del futures, blocker
        finally:
            if cluster is not None:
                client.close()
    return {"tasks": m, "rss_before": before, "rss_after": after,
            "bytes_per_task": (after - before) / m, "where": where}


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
        details["dask"] = dask_scheduler_bytes_per_task(args.dask_tasks, args.workers, args.threads)
        log(f"  {details['dask']['bytes_per_task']:,.0f} B/task ({details['dask']['where']})")

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
        rows.append(row("queue RSS per waiting message", per, "B", "Dask scheduler RSS per pending task",
                        details["dask"]["bytes_per_task"], better="lower"))
    rows.append(row("queue RSS per waiting message", per, "B", "Dask docs: ~16 KiB per task",
                    DASK_DOC_BYTES_PER_TASK, better="lower", note="documented constant, not measured"))
    common.report("memory", args, rows, details, env=env)


if __name__ == "__main__":
    main()
