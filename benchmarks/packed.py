"""packed: ``qp.map(noop, range(N))`` rate and CPU per task (client, workers, consumers'
children) of two source trees, alternated in one run (old, new, new, old, ...).

Each measurement runs in a fresh process whose ``PYTHONPATH`` starts with the tree measured,
so that the client, the workers and the consumers' children all run that tree's daskqueue.
CPU is ``psutil``'s user + system time of each process over the timed ``map`` (after an
untimed warm-up map), divided by N: on a shared machine it stretches much less with others'
load than wall time does.

    PYTHONPATH=$PWD python -m benchmarks.packed --trees old=/work/wt/base,new=$PWD
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks.common import log, positive, row

THIS_FILE = Path(__file__).resolve()


def _cpu_by_process() -> dict[int, tuple[str, float]]:
    """``pid -> (role, CPU seconds)`` of this process and its descendants."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        role = "client" if p.pid == me.pid else "child" if "consumer.child" in cmd else "worker"
        out[p.pid] = (role, t.user + t.system)
    return out


def measure(n: int, isolation: str, workers: int, threads: int) -> dict:
    """One timed ``map`` of ``n`` no-ops on a fresh cluster (runs in the measured tree)."""
    import daskqueue
    from benchmarks import tasks
    from benchmarks.common import daskqueue_pools, local_cluster, timed

    with local_cluster(workers, threads) as client:
        with daskqueue_pools(client, isolation=isolation) as (qp, _):
            qp.map(tasks.noop, range(1000))
            before = _cpu_by_process()
            seconds, out = timed(lambda: qp.map(tasks.noop, range(n)))
            after = _cpu_by_process()
            assert out == list(range(n)), "qp.map returned wrong or misordered results"
    cpu: dict[str, float] = {}
    for pid, (role, c) in after.items():
        cpu[role] = cpu.get(role, 0.0) + c - before.get(pid, (role, 0.0))[1]
    return {"tasks_per_s": n / seconds, "seconds": seconds, "daskqueue": daskqueue.__file__,
            **{f"{role}_us_per_task": c / n * 1e6 for role, c in cpu.items()}}


def run_in_tree(tree: str, n: int, isolation: str, workers: int, threads: int) -> dict:
    """:func:`measure` in a fresh process on ``tree``'s daskqueue."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, str(THIS_FILE.parent.parent)])}
    cmd = [sys.executable, str(THIS_FILE), "--child", str(n), isolation, str(workers), str(threads)]
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"run in {tree} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["daskqueue"].startswith(tree):
        raise RuntimeError(f"run in {tree} imported {result['daskqueue']}")
    return result


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    p = common.parser("packed", __doc__)
    p.add_argument("--trees", default=f"old=/work/wt/base,new={THIS_FILE.parent.parent}",
                   help="name=path,name=path: the two trees, the first is the baseline")
    p.add_argument("--tasks", type=positive, default=1_000_000)
    p.add_argument("--rounds", type=positive, default=2, help="alternated rounds (the order flips each round)")
    p.add_argument("--isolation", default="auto,thread")
    args = p.parse_args()
    env = common.environment("packed")
    trees = [tuple(t.split("=", 1)) for t in args.trees.split(",")]
    (old_name, _), (new_name, _) = trees
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for isolation in args.isolation.split(","):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                log(f"round {r + 1}, {name}, isolation={isolation!r} (load {_load()})")
                result = run_in_tree(tree, args.tasks, isolation, args.workers, args.threads)
                log(f"  {result['tasks_per_s']:,.0f} tasks/s, client {result.get('client_us_per_task', 0):.2f} "
                    f"us/task, workers {result.get('worker_us_per_task', 0):.2f}, children "
                    f"{result.get('child_us_per_task', 0):.2f}")
                runs.setdefault((name, isolation), []).append(result)
    rows = []
    for isolation in args.isolation.split(","):
        old, new = runs[(old_name, isolation)], runs[(new_name, isolation)]
        for key, what, unit, better in [("tasks_per_s", "map", "tasks/s", "higher"),
                                        ("client_us_per_task", "client CPU", "us/task", "lower"),
                                        ("worker_us_per_task", "workers' CPU", "us/task", "lower"),
                                        ("child_us_per_task", "children's CPU", "us/task", "lower")]:
            o = [x.get(key, 0.0) for x in old]
            w = [x.get(key, 0.0) for x in new]
            if not any(o) and not any(w):
                continue
            rows.append(row(f"{what}, isolation={isolation} (median of {len(w)})", statistics.median(w), unit,
                            old_name, statistics.median(o), better=better))
    common.report("packed", args, rows, {f"{name} {iso}": v for (name, iso), v in runs.items()}, env=env)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        n, isolation, workers, threads = sys.argv[2:6]
        print(json.dumps(measure(int(n), isolation, int(workers), int(threads))), flush=True)
        sys.exit(0)
    main()
