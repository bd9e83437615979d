"""latency_cpu: the CPU time of every process on one task's path, per single task.

``cp.result(qp.submit(noop, i))`` on an idle 2 x 1 ``LocalCluster``, ``--gap-ms`` of idle before
each sample (as ``benchmarks.peers``). Around each sample: the client's calling thread's CPU
(``time.thread_time``: it writes and reads the lane itself) and the CPU of every thread of
every worker process and of their children (the consumers' child processes), read from
``/proc/<pid>/task/*/schedstat`` (ns, Linux). After an idle gap the chain's processes run
on one core in turn (benchmarks/README.md, lat3), so their CPU sum is about the latency: this
says which process to cut, and it is far less noisy than the latency on a shared machine.

``--flag module.attr`` (repeatable) switches module attributes between ``False`` and
``True`` on the client and the workers (``client.run``), in alternating blocks of
``--block`` samples inside one cluster (a measurement tool for a cut kept behind a flag
while it is measured; the child processes keep their own modules). Without it, one arm.
"""

from __future__ import annotations

import importlib
import os
import statistics
import time
from typing import Any

from benchmarks import common
from benchmarks.common import daskqueue_pools, local_cluster, log, positive
from benchmarks.tasks import noop


def set_flags(names: list[str], value: bool) -> bool:
    """Set each ``module.attr`` of ``names`` to ``value`` in this process."""
    for name in names:
        module, _, attr = name.rpartition(".")
        setattr(importlib.import_module(module), attr, value)
    return value


def _stat_paths(pid: int) -> list[str]:
    return [f"/proc/{pid}/task/{t}/schedstat" for t in os.listdir(f"/proc/{pid}/task")]


def _cpu_ns(paths: list[str]) -> int:
    total = 0
    for path in paths:
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except OSError:  # a thread ended
            pass
    return total


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def sample(qp: Any, cp: Any, procs: dict[str, list[str]], gap_s: float) -> dict[str, float]:
    """One task after ``gap_s`` of idle: wall and CPU (us) of the client's thread (in
    ``submit``, in all) and of the busiest worker and child."""
    time.sleep(gap_s)
    before = {k: _cpu_ns(v) for k, v in procs.items()}
    w0, t0 = time.perf_counter_ns(), time.thread_time_ns()
    tid = qp.submit(noop, 0)
    t_sub = time.thread_time_ns()
    cp.result(tid, timeout=60)
    t1, w1 = time.thread_time_ns(), time.perf_counter_ns()
    used = {k: _cpu_ns(v) - before[k] for k, v in procs.items()}
    workers = max(v for k, v in used.items() if k.startswith("worker"))
    children = max([v for k, v in used.items() if k.startswith("child")] or [0])
    return {"wall": (w1 - w0) / 1e3, "client submit": (t_sub - t0) / 1e3, "client": (t1 - t0) / 1e3,
            "busiest worker": workers / 1e3, "busiest child": children / 1e3,
            "sum": (t1 - t0 + sum(used.values())) / 1e3}


def main() -> None:
    p = common.parser("latency_cpu", __doc__)
    p.add_argument("--n", type=positive, default=300, help="samples (per arm with --flag)")
    p.add_argument("--gap-ms", type=float, default=20.0, help="idle pause before every sample")
    p.add_argument("--isolation", default="auto", help="consumers' isolation")
    p.add_argument("--flag", action="append", default=[], help="module.attr switched off/on (repeatable)")
    p.add_argument("--block", type=positive, default=40, help="samples per block with --flag")
    args = p.parse_args()
    env = common.environment("latency_cpu")
    arms: dict[str, list[dict[str, float]]] = {"off": [], "on": []} if args.flag else {"tree": []}
    with local_cluster(args.workers, args.threads) as client:
        with daskqueue_pools(client, isolation=args.isolation) as (qp, cp):
            qp.map(noop, range(1000))
            for _ in range(50):
                cp.result(qp.submit(noop, 0), timeout=60)
            pids = list(client.run(os.getpid).values())
            procs = {f"worker {p}": _stat_paths(p) for p in pids}
            procs.update({f"child {c}": _stat_paths(c) for p in pids for c in _children(p)})
            log(f"processes watched: {sorted(procs)}")
            if not args.flag:
                arms["tree"] = [sample(qp, cp, procs, args.gap_ms / 1000) for _ in range(args.n)]
            else:
                b = 0
                while len(arms["on"]) < args.n:
                    for on in ((False, True) if b % 2 == 0 else (True, False)):
                        set_flags(args.flag, on)
                        client.run(set_flags, args.flag, on)
                        for _ in range(3):  # the switch's own first runs are not sampled
                            cp.result(qp.submit(noop, 0), timeout=60)
                        k = min(args.block, args.n - len(arms["on" if on else "off"]))
                        arms["on" if on else "off"] += [sample(qp, cp, procs, args.gap_ms / 1000) for _ in range(k)]
                    b += 1
    keys = ["wall", "client submit", "client", "busiest worker", "busiest child", "sum"]
    lines = []
    for arm, rows in arms.items():
        for key in keys:
            v = [r[key] for r in rows]
            lines.append([arm, key, f"{statistics.median(v):.0f}", f"{common.percentile(v, 90):.0f}",
                          f"{statistics.mean(v):.0f}"])
    print(common.render_table(["arm", "per task (us)", "p50", "p90", "mean"], lines, markdown=True))
    base = arms["off"] if args.flag else arms["tree"]
    wall = statistics.median(r["wall"] for r in base)
    rows = [common.row(f"{arm} {key} p50", statistics.median(r[key] for r in rs) / 1000, "ms",
                       "wall p50" + (" (off)" if args.flag else ""), wall / 1000, better="lower")
            for arm, rs in arms.items() for key in keys]
    common.report("latency_cpu", args, rows, {"samples": arms}, env=env)


if __name__ == "__main__":
    main()
