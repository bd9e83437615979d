"""durable_map: the end-to-end row of ``benchmarks/durable.py`` (a durable ``qp.map`` of N
no-ops, after a warm map of 1,000, on a fresh pool), repeated on one cluster, with its median
and best, and how many times the waiting ``map`` slept 10 ms or more.

One run of ``durable.py --repeat 1`` is one 50-90 ms sample: too coarse to compare two trees.
This runs the same thing ``--repeat`` times. It uses only what every tree since 5cff51c has
(``benchmarks.common``), so it measures an old tree too:

    cd /work/wt/old && PYTHONPATH=$PWD python /path/to/benchmarks/durable_map.py --repeat 12
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import tasks
from benchmarks.common import daskqueue_pools, local_cluster


def _count_long_sleeps() -> list[int]:
    """Count the main thread's sleeps of 10 ms or more (the map's waits between empty rounds)."""
    count = [0]
    real, main = time.sleep, threading.main_thread()

    def sleep(seconds: float) -> None:
        if seconds >= 0.01 and threading.current_thread() is main:
            count[0] += 1
        real(seconds)

    time.sleep = sleep  # type: ignore[assignment]
    return count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000, help="tasks per timed map")
    p.add_argument("--repeat", type=int, default=12, help="fresh pools, one timed map each")
    p.add_argument("--fsync", default="interval", choices=("always", "interval", "never"))
    args = p.parse_args()
    sleeps = _count_long_sleeps()
    work = Path(tempfile.mkdtemp(prefix="daskqueue-durable-map-"))
    walls, slept = [], []
    try:
        with local_cluster(2, 1) as client:
            for rep in range(args.repeat):
                opts = {"durability": "durable", "dirpath": str(work / f"q{rep}"), "fsync": args.fsync}
                with daskqueue_pools(client, queue_options=opts) as (qp, _):
                    qp.map(tasks.noop, range(1000))
                    sleeps[0] = 0
                    t0 = time.perf_counter()
                    res = qp.map(tasks.noop, range(args.tasks))
                    walls.append(time.perf_counter() - t0)
                    slept.append(sleeps[0])
                    assert res == list(range(args.tasks))
                shutil.rmtree(work / f"q{rep}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median(walls)
    print(json.dumps({"tasks": args.tasks, "median_s": round(med, 4), "min_s": round(min(walls), 4),
                      "median_tasks_per_s": round(args.tasks / med), "long_sleeps_per_map": statistics.mean(slept),
                      "walls_s": [round(w, 4) for w in walls]}))


if __name__ == "__main__":
    main()
