"""latency_loop: the queue worker's event loop on one task's path, callback by callback.

``cp.result(qp.submit(noop, 0))`` on an idle 2 x 1 ``LocalCluster`` (``--gap-ms`` of idle
before each sample). On the workers, every loop callback (``asyncio.events.Handle._run``) is
timed (wall and ``time.thread_time``). Per sample, on the worker that served the task: the
callbacks from the lane's read of the put (``_SelectorSocketTransport._read_ready``) to the
last lane request step that started before the client had its answer (the poll's answer),
their count, their CPU, and the whole loop's CPU in the sample. The table gives each step of
the most common sequence (p50 wall and CPU, us). A client thread woken by a step's ``send``
may run inside that step on the same core: then its wall exceeds its CPU.

``--flag module.attr`` (repeatable) switches module attributes off/on on the client and the
workers in alternating blocks of ``--block`` samples, as ``benchmarks.latency_cpu`` does. It
calls ``client.run`` around every sample (to switch the recording on and off), which wakes
the workers before each sample: compare arms of one run only, and confirm a cut with
``latency_cpu``, which does not (benchmarks/README.md, lat5, cut B).
"""

from __future__ import annotations

import collections
import os
import statistics
import time
from typing import Any

from benchmarks import common
from benchmarks.common import daskqueue_pools, local_cluster, positive
from benchmarks.latency_cpu import set_flags
from benchmarks.tasks import noop


def _install(dask_worker: Any = None) -> None:
    """Time every loop callback of this worker while ``dask_worker._loop_rec_on``."""
    import asyncio.events as events

    rec: list[tuple[int, int, int, int, str]] = []
    dask_worker._loop_rec, dask_worker._loop_rec_on = rec, False
    run = events.Handle._run

    def timed(handle: Any) -> None:
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        run(handle)
        if dask_worker._loop_rec_on:
            cb = handle._callback
            name = getattr(cb, "__qualname__", "") or repr(cb)[:40]
            owner = getattr(cb, "__self__", None)
            if type(owner).__name__ == "Task":
                name = "task " + getattr(owner.get_coro(), "__qualname__", "?")
            rec.append((t0, time.perf_counter_ns(), c0, time.thread_time_ns(), name))

    events.Handle._run = timed  # type: ignore[method-assign]


def _on(dask_worker: Any = None) -> None:
    dask_worker._loop_rec.clear()
    dask_worker._loop_rec_on = True


def _off(dask_worker: Any = None) -> list[tuple[int, int, int, int, str]]:
    dask_worker._loop_rec_on = False
    return list(dask_worker._loop_rec)


def _path(rec: list[tuple[int, int, int, int, str]], t0: int, t1: int) -> list[tuple[str, float, float]] | None:
    """The steps from the lane read to the last lane request step started by ``t1``."""
    reads = [r for r in rec if r[0] >= t0 and "read_ready" in r[4]]
    ends = [r for r in rec if r[4] == "task _LaneProtocol._run" and t0 <= r[0] <= t1]
    if not reads or len(ends) < 2:
        return None
    start, end = reads[0][0], ends[-1][0]
    return [(r[4], (r[1] - r[0]) / 1e3, (r[3] - r[2]) / 1e3) for r in rec if start <= r[0] <= end]


def main() -> None:
    p = common.parser("latency_loop", __doc__)
    p.add_argument("--n", type=positive, default=200, help="samples (per arm with --flag)")
    p.add_argument("--gap-ms", type=float, default=20.0, help="idle pause before every sample")
    p.add_argument("--isolation", default="auto", help="consumers' isolation")
    p.add_argument("--flag", action="append", default=[], help="module.attr switched off/on (repeatable)")
    p.add_argument("--block", type=positive, default=20, help="samples per block with --flag")
    args = p.parse_args()
    env = common.environment("latency_loop")
    arms: dict[str, list[dict[str, Any]]] = {"off": [], "on": []} if args.flag else {"tree": []}
    with local_cluster(args.workers, args.threads) as client:
        with daskqueue_pools(client, isolation=args.isolation) as (qp, cp):
            qp.map(noop, range(1000))
            for _ in range(50):
                cp.result(qp.submit(noop, 0), timeout=60)
            client.run(_install)
            b = 0
            while len(arms["on" if args.flag else "tree"]) < args.n:
                for arm in ((("off", "on") if b % 2 == 0 else ("on", "off")) if args.flag else ("tree",)):
                    if args.flag:
                        set_flags(args.flag, arm == "on")
                        client.run(set_flags, args.flag, arm == "on")
                    for _ in range(3):
                        cp.result(qp.submit(noop, 0), timeout=60)
                    k = min(args.block if args.flag else args.n, args.n - len(arms[arm]))
                    for _ in range(k):
                        client.run(_on)
                        time.sleep(args.gap_ms / 1000)
                        t0 = time.perf_counter_ns()
                        cp.result(qp.submit(noop, 0), timeout=60)
                        t1 = time.perf_counter_ns()
                        for rec in client.run(_off).values():
                            steps = _path(rec, t0, t1)
                            if steps is not None:
                                arms[arm].append({"wall": (t1 - t0) / 1e3, "steps": steps,
                                                  "path cpu": sum(c for _, _, c in steps),
                                                  "loop cpu": sum(r[3] - r[2] for r in rec) / 1e3})
                b += 1
    rows = []
    for arm, samples in arms.items():
        for key in ("wall", "path cpu", "loop cpu"):
            rows.append([arm, key, f"{statistics.median(s[key] for s in samples):.0f}"])
        rows.append([arm, "steps", f"{statistics.median(len(s['steps']) for s in samples):.0f}"])
    print(common.render_table(["arm", "per task (us)", "p50"], rows, markdown=True))
    for arm, samples in arms.items():
        seqs = collections.Counter(tuple(n for n, _, _ in s["steps"]) for s in samples)
        usual = seqs.most_common(1)[0][0]
        same = [s["steps"] for s in samples if tuple(n for n, _, _ in s["steps"]) == usual]
        print(f"\n{arm}: {len(same)} of {len(samples)} samples in the usual sequence")
        print(common.render_table(
            ["#", "step", "wall p50", "CPU p50"],
            [[str(k), name, f"{statistics.median(s[k][1] for s in same):.0f}",
              f"{statistics.median(s[k][2] for s in same):.0f}"] for k, name in enumerate(usual)], markdown=True))
    base = arms["off"] if args.flag else arms["tree"]
    wall = statistics.median(s["wall"] for s in base)
    out = [common.row(f"{arm} {key} p50", statistics.median(s[key] for s in rs) / 1000, "ms", "wall p50", wall / 1000,
                      better="lower") for arm, rs in arms.items() for key in ("wall", "path cpu", "loop cpu")]
    common.report("latency_loop", args, out, {"arms": {a: [{k: v for k, v in s.items() if k != "steps"} for s in rs]
                                                      for a, rs in arms.items()}}, env=env)


if __name__ == "__main__":
    main()
