"""mixed_maps: only daskqueue's maps of ``benchmarks.mixed``, several per process, for A/B runs of trees.

``python benchmarks/mixed_maps.py --batch-size adaptive --tasks 10000 --maps 2`` prints each
map's makespan and makespan / measured ideal (see ``benchmarks.mixed``), with fresh pools for
each map (the adaptive batch size starts from scratch each time, as in ``mixed``). It skips
``client.map`` and the local threads, which do not change between trees. Run by path with a
tree's root on ``PYTHONPATH`` (``cd TREE && PYTHONPATH=$PWD python PATH/mixed_maps.py ...``): it
imports only what every tree since 5cff51c has (``benchmarks.mixed.durations``,
``benchmarks.common``), so the same driver measures an older tree's daskqueue.
"""

from __future__ import annotations

import argparse
import time

from benchmarks import tasks
from benchmarks.common import daskqueue_pools, local_cluster
from benchmarks.mixed import durations


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", default="adaptive", help="a fixed size, or 'adaptive'")
    p.add_argument("--isolation", choices=["auto", "thread", "process"], default="auto")
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--maps", type=int, default=2, help="maps in this process, each with fresh pools")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    batch_size = None if args.batch_size == "adaptive" else int(args.batch_size)
    work = durations(args.tasks, mean_s=0.001, sigma=1.0, tail_fraction=0.001, tail_s=0.2, seed=12345)
    options = {} if args.isolation == "auto" else {"isolation": args.isolation}
    figures = []
    with local_cluster(args.workers, 1) as client:
        client.gather(client.map(tasks.noop, range(20)))
        for _ in range(args.maps):
            with daskqueue_pools(client, batch_size=batch_size, **options) as (qp, _cp):
                started = time.perf_counter()
                out = qp.map(tasks.sleep_timed, work)
                seconds = time.perf_counter() - started
            figures.append(f"{seconds:.2f} s / {seconds / (sum(out) / args.workers):.3f}x")
    print(f"batch_size={args.batch_size} isolation={args.isolation} tasks={args.tasks}: " + ", ".join(figures),
          flush=True)


if __name__ == "__main__":
    main()
