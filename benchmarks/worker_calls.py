"""worker_calls: one worker's call to a queue actor on another worker, through Dask and by lane.

On a 2 x 1 ``LocalCluster`` with a transient pool of two queues (one per worker), worker A
calls queue B's ``work_at`` (a queue's work announcement: four small arguments, nothing
done with them that costs) ``--n`` times in a row, alternately through Dask's actor call and
through the queue actor's lane (:mod:`daskqueue.queue.worker_lane`), ``--rounds`` times each:
the wall time per call, and the CPU per call of the calling worker's process and of the
called one's (``psutil``). Consumers' fetches and settles at another worker's queue take the
same two ways.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import psutil

from benchmarks.common import environment, local_cluster, log, parser, positive, report, row


async def _calls(dask_worker: Any, cls: type, address: str, key: str, n: int, how: str) -> tuple[float, float]:
    """On worker A: ``n`` calls of queue B's ``work_at``; (wall us, this process's CPU us) per call."""
    from daskqueue.queue.actor_handles import WorkerActor

    handle = WorkerActor(cls, address, key, worker=dask_worker)

    def call() -> Any:
        if how == "lane":
            return handle.work_at(7, None, 0, 0)
        return handle._through_dask("work_at", (7, None, 0, 0))

    await call()  # the lane is opened by the first call
    me = psutil.Process()
    c0 = sum(me.cpu_times()[:2])
    t0 = time.perf_counter()
    for _ in range(n):
        await call()
    wall = time.perf_counter() - t0
    return wall / n * 1e6, (sum(me.cpu_times()[:2]) - c0) / n * 1e6


def main() -> None:
    p = parser("worker_calls", __doc__)
    p.add_argument("--n", type=positive, default=1000, help="calls per sample")
    p.add_argument("--rounds", type=positive, default=3, help="alternated samples of each way")
    args = p.parse_args()
    env = environment("worker_calls")
    from daskqueue import QueuePool

    samples: dict[str, list[dict[str, float]]] = {"dask": [], "lane": []}
    with local_cluster(2, 1) as client:
        qp = QueuePool(client, 2)
        try:
            a, b = qp.queues[0]._address, qp.queues[1]._address
            assert a != b, "the two queues are meant to be on different workers"
            handle = qp.queues[1]
            callee = psutil.Process(client.run(os.getpid, workers=[b])[b])
            for r in range(args.rounds):
                for how in ("dask", "lane") if r % 2 == 0 else ("lane", "dask"):
                    c0 = sum(callee.cpu_times()[:2])
                    wall, caller = client.run(_calls, cls=handle._cls, address=b, key=handle.key, n=args.n,
                                              how=how, workers=[a])[a]
                    callee_us = (sum(callee.cpu_times()[:2]) - c0) / args.n * 1e6
                    samples[how].append({"wall_us": wall, "caller_cpu_us": caller, "callee_cpu_us": callee_us})
                    log(f"round {r + 1} {how}: {wall:.0f} us a call, CPU {caller:.0f} us caller, "
                        f"{callee_us:.0f} us callee")
        finally:
            qp.close()
    med = {how: {k: statistics.median(s[k] for s in ss) for k in ss[0]} for how, ss in samples.items()}
    rows = [row(f"worker-to-worker call, {k.replace('_us', '').replace('_', ' ')}", med["lane"][k], "us",
                "through Dask", med["dask"][k], better="lower") for k in ("wall_us", "caller_cpu_us", "callee_cpu_us")]
    report("worker_calls", args, rows, {"samples": samples, "medians": med}, env=env)


if __name__ == "__main__":
    main()
