"""burst: a million messages due at the same second (the top-of-the-hour case).

``--tasks`` no-op tasks are put with one ``eta`` a few seconds ahead (``batch_submit(...,
eta=...)``), with the consumers already started; at the due second they all become ready at
once. Measured: from the due time until every result is in (the drain rate), and the
largest gap of each queue worker's event loop from just before the due time to the end (a
5 ms ticker on the loop; a gap is how late a tick came). Baseline in the same run: the
same tasks put with no delay while the consumers are stopped, then drained from the start
of the consumers (the noop rate of a full queue).
"""

from __future__ import annotations

import asyncio
import time

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row

TICK_S = 0.005


async def _start_ticker(dask_worker) -> None:
    """On the worker's loop: a ticker that records its largest lateness since the last reset."""
    state = getattr(dask_worker, "_dq_ticker", None)
    if state is None:
        state = dask_worker._dq_ticker = {"max_gap_s": 0.0}

        async def tick() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(TICK_S)
                now = time.perf_counter()
                state["max_gap_s"] = max(state["max_gap_s"], now - last - TICK_S)
                last = now

        state["task"] = asyncio.ensure_future(tick())
    state["max_gap_s"] = 0.0


def _gap(dask_worker) -> float:
    return dask_worker._dq_ticker["max_gap_s"]


def run(client, n: int, lead_s: float | None) -> dict:
    """Put ``n`` no-ops due ``lead_s`` from now (None: no delay); drain them; time it."""
    with daskqueue_pools(client) as (qp, cp):
        qp.map(tasks.noop, range(1000))  # warm up
        if lead_s is None:
            cp.cancel()  # the baseline: drain the same messages, all ready before it starts
        client.run(_start_ticker)
        put_started = time.time()
        eta = None if lead_s is None else put_started + lead_s
        ids = qp.batch_submit([(tasks.noop, i) for i in range(n)], eta=eta)
        put_s = time.time() - put_started
        if eta is not None:
            if time.time() > eta - 0.5:
                raise SystemExit(f"putting took {put_s:.1f} s, past the due time: raise --lead-s")
            time.sleep(max(0.0, eta - 0.5 - time.time()))
        client.run(_start_ticker)  # reset: count the gaps of the burst, not of the puts
        start = max(time.time(), eta or 0.0)
        while time.time() < start:
            time.sleep(0.001)
        if lead_s is None:
            cp.start()
        cp.join(timeout=3600)
        seconds = time.time() - start
        results = qp.results()
        assert len(results) >= n and all(results[i] == k for k, i in enumerate(ids[:1000])), "lost results"
        gaps = client.run(_gap)
    return {"tasks": n, "put_s": put_s, "drain_s": seconds, "tasks_per_s": n / seconds,
            "max_loop_gap_s": max(gaps.values()), "loop_gaps_s": gaps}


def main() -> None:
    p = common.parser("burst", __doc__)
    p.add_argument("--tasks", type=positive, default=1_000_000, help="messages due at once")
    p.add_argument("--lead-s", type=float, default=8.0, help="seconds from the put to the due time")
    p.add_argument("--rounds", type=positive, default=2, help="alternated rounds of each")
    args = p.parse_args()
    env = common.environment("burst")
    details: dict = {"burst": [], "noop": []}
    with local_cluster(args.workers, args.threads) as client:
        for r in range(args.rounds):
            for kind, lead in (("burst", args.lead_s), ("noop", None)):
                d = run(client, args.tasks, lead)
                details[kind].append(d)
                log(f"round {r + 1} {kind}: {d['tasks_per_s']:,.0f} tasks/s, largest loop gap "
                    f"{d['max_loop_gap_s'] * 1000:.1f} ms (put {d['put_s']:.1f} s)")
    burst = max(details["burst"], key=lambda d: d["tasks_per_s"])
    noop = max(details["noop"], key=lambda d: d["tasks_per_s"])
    rows = [
        row("drain rate of messages due at once (tasks/s)", burst["tasks_per_s"], "tasks/s",
            "same tasks, no delay", noop["tasks_per_s"], note="issue 12: at the noop rate"),
        row("largest queue-worker loop gap during the burst (ms)",
            max(d["max_loop_gap_s"] for d in details["burst"]) * 1000, "ms",
            "same, no delay", max(d["max_loop_gap_s"] for d in details["noop"]) * 1000,
            better="lower", note="issue 12 target <= 50 ms"),
    ]
    common.report("burst", args, rows, details, env=env)


if __name__ == "__main__":
    main()
