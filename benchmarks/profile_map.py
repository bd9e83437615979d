"""profile_map: py-spy profiles of ``qp.map(noop, range(N))`` on the client and on the workers.

Starts a 2 x 1 ``LocalCluster`` and the pools, warms up, then runs ``py-spy record --pid``
(``--subprocesses``: a worker's consumer child too) on the client process and on each worker
for the length of one ``map`` of ``--n`` no-ops, at ``--rate`` samples/s, and prints, per
process, the functions with most samples: by self time (the innermost frame) and by total
time (any daskqueue frame on the stack). Raw collapsed stacks are kept in ``--out``.
Needs ``py-spy`` (root, or ptrace allowed).
"""

from __future__ import annotations

import collections
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive


def frame_name(frame: str) -> str:
    """``func (path/to/mod.py:123)`` -> ``mod.py:func`` (daskqueue's with their package path)."""
    name, _, where = frame.partition(" (")
    path = where.split(":")[0]
    if "daskqueue/" in path:  # keep the package path: queue/pool.py, not pool.py
        return "daskqueue/" + path.rsplit("daskqueue/", 1)[1] + ":" + name
    return f"{os.path.basename(path)}:{name}" if path else name


def summarize(path: Path, top: int) -> dict[str, Any]:
    """Self and inclusive sample counts per function of a py-spy raw (collapsed) file."""
    self_c: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";")]
        total += n
        leaf = frames[-1]
        if any(k in leaf for k in ("select", "poll", "epoll", "wait", "sleep", "acquire")):
            idle += n
        self_c[leaf] += n
        for f in set(frames):
            incl[f] += n
    dq_incl = {f: c for f, c in incl.items() if f.startswith("daskqueue/")}
    return {"samples": total, "idle_like": idle,
            "self": self_c.most_common(top),
            "inclusive": sorted(dq_incl.items(), key=lambda kv: -kv[1])[:top]}


def main() -> None:
    p = common.parser("profile_map", __doc__)
    p.add_argument("--n", type=positive, default=1_000_000)
    p.add_argument("--rate", type=positive, default=100, help="py-spy samples per second")
    p.add_argument("--top", type=positive, default=15)
    p.add_argument("--isolation", default="auto")
    p.add_argument("--out", default="/tmp/dq-profile-map")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = common.environment("profile_map")
    details: dict[str, Any] = {}
    with local_cluster(args.workers, args.threads) as client:
        with daskqueue_pools(client, isolation=args.isolation) as (qp, cp):
            qp.map(tasks.noop, range(200_000))
            t0 = time.perf_counter()
            qp.map(tasks.noop, range(args.n))
            est = time.perf_counter() - t0
            log(f"unprofiled map of {args.n:,}: {args.n / est:,.0f} tasks/s")
            pids = {"client": os.getpid(), **{f"worker {a}": pid for a, pid in client.run(os.getpid).items()}}
            spies = {}
            for name, pid in pids.items():
                raw = out / f"{name.replace(' ', '_').replace(':', '_').replace('/', '')}.txt"
                cmd = ["py-spy", "record", "--pid", str(pid), "--rate", str(args.rate), "--format", "raw",
                       "--output", str(raw), "--nonblocking", "--threads"]
                if name != "client":
                    cmd.append("--subprocesses")
                spies[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), raw)
            time.sleep(1.0)  # py-spy attaches
            t0, c0 = time.perf_counter(), time.process_time()
            qp.map(tasks.noop, range(args.n))
            s, c = time.perf_counter() - t0, time.process_time() - c0
            time.sleep(0.2)
            for proc, _ in spies.values():
                proc.send_signal(2)  # SIGINT: py-spy writes its output and stops
            for name, (proc, raw) in spies.items():
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            details["profiled_map"] = {"tasks": args.n, "seconds": s, "per_s": args.n / s,
                                       "client_cpu_us_per_task": 1e6 * c / args.n}
            log(f"profiled map of {args.n:,}: {args.n / s:,.0f} tasks/s; client CPU "
                f"{1e6 * c / args.n:.2f} us/task (main thread + event loop)")
    for name, (_, raw) in spies.items():
        if not raw.exists():
            log(f"{name}: no profile ({raw})")
            continue
        summ = summarize(raw, args.top)
        details[name] = summ
        print(f"\n### {name}: {summ['samples']} samples ({summ['idle_like']} in waits)")
        print(common.render_table(["self (innermost frame)", "samples"], [[f, str(c)] for f, c in summ["self"]],
                                  markdown=True))
        print(common.render_table(["inclusive, daskqueue functions", "samples"],
                                  [[f, str(c)] for f, c in summ["inclusive"]], markdown=True))
    common.report("profile_map", args, [], details, env=env)


if __name__ == "__main__":
    main()
