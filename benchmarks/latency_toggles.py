"""latency_toggles: the single-task latency with one client-side cut on and off, alternated
sample by sample in one process (so the machine's load drifts equally over both arms).

``cp.result(qp.submit(noop, i))`` on a 2 x 1 ``LocalCluster`` with ``--gap-ms`` of idle
before each sample, as in ``benchmarks.peers``. ``--cut prime`` switches the outcome poll that
a small send starts with its put (``daskqueue.queue.sending.PRIME_MAX_MESSAGES``: 16 or -1);
``--cut callfuture`` switches the queue handles' ``CallFuture`` calls against Dask's own
``Actor`` calls (``ActorFuture``). Both are switched by patching module attributes of this
process only: a measurement tool, not an option of the package.
"""

from __future__ import annotations

import argparse
import time

from typing import Any

from benchmarks.tasks import noop

#: ``DirectActor.__getattr__`` as the package has it (the ``callfuture`` cut), kept by ``main``.
_FAST: Any = None


def _switch(cut: str, on: bool) -> None:
    from distributed.actor import Actor

    import daskqueue.queue.actor_handles as handles
    import daskqueue.queue.sending as sending

    if cut == "prime":
        sending.PRIME_MAX_MESSAGES = 16 if on else -1
    elif on:
        handles.DirectActor.__getattr__ = _FAST  # type: ignore[method-assign]
    else:
        handles.DirectActor.__getattr__ = Actor.__getattr__  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cut", choices=["prime", "callfuture"], required=True)
    p.add_argument("--n", type=int, default=1600, help="samples (half with the cut on)")
    p.add_argument("--gap-ms", type=float, default=20.0)
    p.add_argument("--isolation", default="auto")
    args = p.parse_args()
    global _FAST
    from distributed import Client, LocalCluster

    from daskqueue.queue.actor_handles import DirectActor

    _FAST = DirectActor.__dict__["__getattr__"]

    from daskqueue import ConsumerPool, QueuePool

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        qp = QueuePool(client)
        cp = ConsumerPool(client, qp, isolation=args.isolation)
        cp.start()
        for i in range(30):
            cp.result(qp.submit(noop, i), timeout=60)
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(args.n):
            on = i % 2 == 0
            _switch(args.cut, on)
            time.sleep(args.gap_ms / 1000)
            t0 = time.perf_counter()
            cp.result(qp.submit(noop, i), timeout=60)
            times[on].append((time.perf_counter() - t0) * 1000)
        _switch(args.cut, True)
        cp.close()
        qp.close()
    for on, ts in times.items():
        ts.sort()
        k = len(ts)
        print(f"{args.cut} {'on ' if on else 'off'}: p50 {ts[k // 2]:.2f} p90 {ts[int(k * 0.9)]:.2f} "
              f"p99 {ts[int(k * 0.99)]:.2f} ms ({k} samples)")


if __name__ == "__main__":
    main()
