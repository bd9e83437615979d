"""child_start: what starting a consumer pool costs with the default isolation (issue 20).

1. ``child``: a consumer's child process from start to exit: a fresh interpreter runs the
   child's entry point (``CHILD_MAIN``), gets the init frame of a ``GeneralConsumer`` twin,
   builds it, answers "ready" and ends at end of input. That is what every consumer that
   shares its worker with a queue (``isolation="auto"``) waits for before it runs anything.
2. ``pool``: ``ConsumerPool(...).start()`` to the first task's result, on fresh pools, on a
   LocalCluster of 2 workers x 1 thread, ``isolation="auto"`` (one child per consumer) and
   ``"thread"`` (no child) alternated.

Medians of alternated runs. Run it from a tree's root, or with ``PYTHONPATH=<tree>`` to measure
another tree (the script imports nothing from ``benchmarks``)::

    python benchmarks/child_start.py --runs 7
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def child_seconds() -> float:
    import cloudpickle

    from daskqueue.consumer.child import encode_frame
    from daskqueue.consumer.general import GeneralConsumer
    from daskqueue.consumer.isolate import CHILD_MAIN

    spec = cloudpickle.dumps((GeneralConsumer, (0, [None]), {"isolation": "thread"}))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD_MAIN], input=encode_frame(("init", spec)),
                          capture_output=True, timeout=120)
    seconds = time.perf_counter() - start
    assert done.returncode == 0 and b"ready" in done.stdout, done.stderr.decode()
    return seconds


def pool_seconds(client, isolation: str, n_consumers: int) -> float:
    from daskqueue import ConsumerPool, QueuePool

    qp = QueuePool(client, 2)
    try:
        start = time.perf_counter()
        cp = ConsumerPool(client, qp, n_consumers=n_consumers, isolation=isolation)
        cp.start()
        assert qp.result(qp.submit(abs, -3), timeout_s=120) == 3
        seconds = time.perf_counter() - start
        cp.close()
        return seconds
    finally:
        qp.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--consumers", type=int, default=2, help="consumers per pool (one per worker)")
    args = p.parse_args()
    import daskqueue

    print(f"daskqueue from {daskqueue.__file__}")
    child = [child_seconds() for _ in range(args.runs)]
    print(f"child start to exit: median {statistics.median(child):.3f} s, min {min(child):.3f} s "
          f"({args.runs} runs)")
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
        times: dict[str, list[float]] = {"auto": [], "thread": []}
        for _ in range(args.runs):
            for isolation in times:
                times[isolation].append(pool_seconds(client, isolation, args.consumers))
    for isolation, values in times.items():
        print(f"pool start to first result, isolation={isolation!r}, {args.consumers} consumers: median "
              f"{statistics.median(values):.3f} s, min {min(values):.3f} s ({args.runs} runs)")


if __name__ == "__main__":
    main()
