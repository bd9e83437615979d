"""stream: client memory while millions of results stream through ``as_completed``.

N (default 5,000,000) no-op tasks are put with ``batch_submit`` in chunks (default 100,000),
two chunks in flight: while one chunk runs, the outcomes of the one before are taken with
``ConsumerPool.as_completed(ids)`` and dropped. The client's RSS (after ``gc.collect()`` and
``malloc_trim``) is sampled after every chunk; reported: its largest growth over the RSS
before the run.

Baseline in the same run, on the same cluster: ``QueuePool.map`` of the same N no-op tasks,
which returns (and so holds) every result: the client's RSS growth while the list is held.
Throughput of both is reported too (the streaming run pays one ``as_completed`` per chunk).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row


def rss() -> int:
    gc.collect()
    return tasks.rss_trimmed()


def stream(qp: Any, cp: Any, n: int, chunk: int) -> dict[str, Any]:
    before = rss()
    samples = []
    started = time.perf_counter()
    pending: list[int] | None = None
    done = 0
    for first in range(0, n, chunk):
        ids = qp.batch_submit([(tasks.noop, i) for i in range(first, min(n, first + chunk))])
        if pending is not None:
            done += sum(1 for _ in cp.as_completed(pending, timeout=600))
            samples.append(rss() - before)
        pending = ids
    done += sum(1 for _ in cp.as_completed(pending, timeout=600))
    seconds = time.perf_counter() - started
    samples.append(rss() - before)
    assert done == n, f"{done:,} outcomes for {n:,} tasks"
    return {"tasks": n, "chunk": chunk, "seconds": seconds, "rate": n / seconds, "rss_before": before,
            "growth_max": max(samples), "growth_samples": samples}


def hold(qp: Any, n: int) -> dict[str, Any]:
    before = rss()
    started = time.perf_counter()
    out = qp.map(tasks.noop, range(n), timeout_s=1200)
    seconds = time.perf_counter() - started
    growth = rss() - before
    assert len(out) == n
    del out
    return {"tasks": n, "seconds": seconds, "rate": n / seconds, "rss_before": before, "growth": growth,
            "after_release": rss() - before}


def main() -> None:
    p = common.parser("stream", __doc__)
    p.add_argument("--tasks", type=positive, default=5_000_000, help="N no-op tasks per run")
    p.add_argument("--chunk", type=positive, default=100_000, help="tasks per batch_submit while streaming")
    args = p.parse_args()
    env = common.environment("stream")
    with local_cluster(args.workers, args.threads) as client, daskqueue_pools(client) as (qp, cp):
        qp.map(tasks.noop, range(10_000))  # warm up, and let the client's imports settle
        log(f"streaming {args.tasks:,} no-op tasks through as_completed, {args.chunk:,} per chunk")
        streamed = stream(qp, cp, args.tasks, args.chunk)
        log(f"  RSS growth at most {streamed['growth_max'] / 2**20:,.1f} MiB; {streamed['rate']:,.0f} tasks/s")
        log(f"map of {args.tasks:,} no-op tasks, holding the results")
        held = hold(qp, args.tasks)
        log(f"  RSS growth {held['growth'] / 2**20:,.1f} MiB while held; {held['rate']:,.0f} tasks/s")
    mib = 2**20
    rows = [
        row(f"client RSS growth, {args.tasks:,} results through as_completed", streamed["growth_max"] / mib,
            "MiB", "map holding every result", held["growth"] / mib, better="lower"),
        row("throughput, streaming", streamed["rate"], "tasks/s", "map", held["rate"]),
    ]
    common.report("stream", args, rows, {"stream": streamed, "map": held}, env=env)


if __name__ == "__main__":
    main()
