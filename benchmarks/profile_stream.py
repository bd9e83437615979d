"""profile_stream: where the client's time goes in issue 24's streaming shapes (py-spy).

On one 2 x 1 ``LocalCluster`` (one queue and one consumer per worker), after a warm-up
``map``, each chosen shape of :mod:`benchmarks.shapes` (``map``, ``as_completed``,
``submit_join_results``, ``batch_submit``) runs once while ``py-spy record --threads`` samples
this process; the raw stacks are then summed per function: self samples (the frame on top) and
inclusive samples (the function anywhere in the stack, once per sample), for the client's main
thread and, apart, every other thread (Dask's event loop). Idle frames (waits on locks,
selectors, conditions) are counted apart, so the "busy" column is CPU.

``PYTHONPATH=$PWD python -m benchmarks.profile_stream --n 1000000 --shapes as_completed``
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

IDLE = ("wait (threading.py", "select (selectors.py", "_worker (concurrent/futures/thread.py",
        "sleep", "acquire", "poll (selectors.py", "_wait_for_tstate_lock", "epoll")


def summarize(path: str, top: int) -> str:
    """Self and inclusive samples per function of a py-spy raw file, main thread apart."""
    self_c: dict[str, collections.Counter[str]] = {"main": collections.Counter(), "other": collections.Counter()}
    incl: dict[str, collections.Counter[str]] = {"main": collections.Counter(), "other": collections.Counter()}
    total = collections.Counter()
    busy = collections.Counter()
    for line in open(path):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        who = "main" if "MainThread" in frames[0] else "other"  # py-spy's first frame names the thread
        total[who] += n
        leaf = frames[-1]
        if any(k in leaf for k in IDLE):
            continue
        busy[who] += n
        self_c[who][leaf] += n
        for f in set(frames[1:]):
            incl[who][f] += n
    out = []
    for who in ("main", "other"):
        out.append(f"== {who} thread(s): {total[who]} samples, {busy[who]} busy")
        out.append("  self:")
        out += [f"    {c:6d} {f}" for f, c in self_c[who].most_common(top)]
        out.append("  inclusive:")
        out += [f"    {c:6d} {f}" for f, c in incl[who].most_common(top)]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--chunk", type=int, default=100_000)
    p.add_argument("--shapes", default="map,as_completed,submit_join_results,batch_submit")
    p.add_argument("--rate", type=int, default=200)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default=tempfile.gettempdir())
    p.add_argument("--gil", action="store_true", help="py-spy --gil: only samples of the thread holding the GIL")
    p.add_argument("--idle", action="store_true", help="py-spy --idle: idle threads' samples too")
    args = p.parse_args()

    from benchmarks import tasks
    from benchmarks.common import daskqueue_pools, local_cluster
    from daskqueue import QueuePool

    n = args.n
    with local_cluster(2, 1) as client, daskqueue_pools(client) as (qp, cp):
        qp.map(tasks.noop, range(2000))

        def as_completed() -> None:
            chunk = min(args.chunk, n)
            batches = [[(tasks.noop, i) for i in range(a, min(n, a + chunk))] for a in range(0, n, chunk)]
            yield_start()
            pending, done = None, 0
            for batch in batches:
                ids = qp.batch_submit(batch)
                if pending is not None:
                    done += sum(1 for _ in cp.as_completed(pending, timeout=600))
                pending = ids
            done += sum(1 for _ in cp.as_completed(pending, timeout=600))
            stop()
            assert done == n

        def submit_join_results() -> None:
            batch = [(tasks.noop, i) for i in range(n)]
            yield_start()
            qp.batch_submit(batch)
            cp.join(timeout=600)
            res = qp.results(clear=True)
            stop()
            assert len(res) >= n

        def batch_submit() -> None:
            batch = [(tasks.noop, i) for i in range(n)]
            bare = QueuePool(client, n_queues=2)
            try:
                bare.batch_submit(batch[:1000])
                yield_start()
                bare.batch_submit(batch)
                stop()
            finally:
                bare.close()

        def run_map() -> None:
            yield_start()
            qp.map(tasks.noop, range(n))
            stop()

        def run_imap(ordered: bool) -> Callable[[], None]:
            def run() -> None:
                yield_start()
                total = 0
                for v in (qp.imap if ordered else qp.imap_unordered)(tasks.noop, (i for i in range(n))):
                    total += v
                stop()
                assert total == n * (n - 1) // 2
            return run

        shapes: dict[str, Callable[[], None]] = {"map": run_map, "as_completed": as_completed,
                                                 "imap": run_imap(True), "imap_unordered": run_imap(False),
                                                 "submit_join_results": submit_join_results,
                                                 "batch_submit": batch_submit}
        for name in args.shapes.split(","):
            raw = os.path.join(args.out, f"profile_stream_{name}.txt")
            started: dict[str, Any] = {}

            def yield_start() -> None:  # the clock and py-spy start once the inputs exist
                started["spy"] = subprocess.Popen(
                    ["py-spy", "record", "--pid", str(os.getpid()), "--rate", str(args.rate), "--threads",
                     "-f", "raw", "-o", raw, "--nonblocking"] + ["--gil"] * args.gil + ["--idle"] * args.idle,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)  # py-spy attaches
                started["t0"] = time.perf_counter()

            def stop() -> None:
                started["t1"] = time.perf_counter()

            shapes[name]()
            seconds = started["t1"] - started["t0"]
            spy = started["spy"]
            spy.send_signal(2)  # SIGINT: py-spy writes what it has
            spy.wait(timeout=60)
            print(f"### {name}: {n / seconds:,.0f} tasks/s ({seconds:.2f} s), load {os.getloadavg()[0]:.1f}")
            print(summarize(raw, args.top))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
