"""adapt_timeline: where churn's adaptive scale-up time goes (issue 24).

The same run as ``benchmarks.churn``'s scale-up (a 1-worker LocalCluster under
``adapt(minimum=1, maximum=3)``, a backlog of 1,000 tasks of 10 ms put by ``batch_submit``),
with the seconds from the put (made ``phase`` seconds after one of ``adapt``'s looks) until:
the scheduler holds a load report with work (``first``), it counts the backlog
(``counted``), ``adapt`` asks for 3 workers (``plan``), and 3 workers have joined
(``workers``). Printed as ``TIMELINE phase/first/counted/plan/workers`` per run. Worker processes take 1-8 s to start on a loaded machine, so
``plan`` is the figure that compares trees; ``workers`` is what churn reports.

Where ``adapt``'s once-a-second look falls relative to the put decides ``plan`` as much as
daskqueue does (churn puts 2 s after ``adapt()`` plus the pools' creation, which differs
between trees). ``--phase S`` puts S seconds after one of ``adapt``'s looks instead: run a
few phases (e.g. 0.05, 0.5, 0.95) in each tree to compare them at the same phase.

Reads the scheduler plugin's state from the client process (LocalCluster's scheduler runs
there) without changing it; works on trees before and after the plugin's ``_Load`` records.
"""

from __future__ import annotations

import time

from benchmarks import common, tasks
from benchmarks.churn import cluster
from benchmarks.common import log, positive

MARKS = ("first", "counted", "plan", "workers")  # seconds from the put


def _reports(plugin) -> tuple[bool, bool]:
    """(a report with work is held, a backlog is counted), read-only."""
    work = counted = False
    for v in list(plugin.loads.values()):
        msg, ok = (v[1], True) if isinstance(v, tuple) else (v.msg, v.confirmed)
        if msg["ready"] or msg["leased"]:
            work = True
            counted = counted or ok
    return work, counted


def _record_looks(adaptive) -> list[float]:
    """The times of ``adaptive``'s looks from now on (its periodic callback looks the
    method up at each call)."""
    looks: list[float] = []
    inner = adaptive.adapt

    async def adapt(*args, **kwargs):
        looks.append(time.perf_counter())
        return await inner(*args, **kwargs)

    adaptive.adapt = adapt
    return looks


def timeline(n: int = 1000, task_s: float = 0.01, limit_s: float = 30.0,
             phase_s: float | None = None) -> dict[str, float]:
    from daskqueue import ConsumerPool, QueuePool

    with cluster(1) as (c, client):
        looks = _record_looks(c.adapt(minimum=1, maximum=3))
        time.sleep(2)  # let adapt settle at its minimum
        qp = QueuePool(client, 1)
        cp = ConsumerPool(client, qp)
        cp.start()
        plugin = c.scheduler.plugins["daskqueue-membership"]
        if phase_s is not None:
            seen = len(looks)
            while len(looks) == seen:
                time.sleep(0.001)
            time.sleep(max(0.0, looks[-1] + phase_s - time.perf_counter()))
        started = time.perf_counter()
        qp.batch_submit([(tasks.sleep_for, task_s)] * n)
        marks: dict[str, float] = {}
        while True:
            now = time.perf_counter() - started
            work, counted = _reports(plugin)
            if work:
                marks.setdefault("first", now)
            if counted:
                marks.setdefault("counted", now)
            if len(c.plan) >= 3:
                marks.setdefault("plan", now)
            if len(c.scheduler.workers) >= 3 or now > limit_s:
                marks["workers"] = now
                break
            time.sleep(0.005)
        earlier = [t for t in looks if t <= started]
        if earlier:
            marks["phase"] = started - earlier[-1]
        cp.join(timeout=120)
        cp.close()
        qp.close()
    return marks


def main() -> None:
    p = common.parser("adapt_timeline", __doc__)
    p.add_argument("--runs", type=positive, default=2)
    p.add_argument("--phase", type=float, default=None,
                   help="put this many seconds after one of adapt's looks (default: as churn does)")
    args = p.parse_args()
    runs = []
    for i in range(args.runs):
        runs.append(timeline(phase_s=args.phase))
        log(f"run {i + 1}: put {runs[-1].get('phase', -1):.2f} s after a look; "
            + " / ".join(f"{k} {runs[-1].get(k, -1):.2f} s" for k in MARKS))
    print("TIMELINE", *["/".join(f"{r.get(k, -1):.2f}" for k in ("phase",) + MARKS) for r in runs])


if __name__ == "__main__":
    main()
