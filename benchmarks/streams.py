"""streams: ``imap`` / ``imap_unordered`` against ``map`` over one generator of N no-op items.

In one run, on one cluster and pool: ``imap``, ``imap_unordered`` and ``map`` (the baseline,
run last: the memory it frees stays with the allocator and would inflate what runs after it)
each take a fresh generator of N (default 10,000,000) no-op items and return or yield every
result. Reported per call: throughput (items/s; a stream's includes the loop that consumes
it) and the client's RSS growth, the peak of a sampling thread (``VmRSS`` of
``/proc/self/status`` every 20 ms) minus the RSS just before the call (after ``gc`` and
``malloc_trim``). Targets (issue 23): a stream's RSS growth under 100 MB and at least 0.8x
``map``'s throughput.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any, Callable, Iterator

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row

MIB = 2**20


def vm_rss() -> int:
    """This process's resident set size in bytes, from ``/proc/self/status``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return tasks.rss()


class PeakRss:
    """Samples ``vm_rss()`` on a thread every ``interval_s`` while in the ``with`` block."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, vm_rss())

    def __enter__(self) -> PeakRss:
        self.peak = vm_rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, vm_rss())


def items(n: int) -> Iterator[int]:
    """The input: a generator, so that nothing but the call under test can list it."""
    return (i for i in range(n))


def measure(name: str, n: int, call: Callable[[Iterator[int]], int]) -> dict[str, Any]:
    """Run ``call(items(n))`` (it returns how many results it saw) under a peak-RSS sampler."""
    gc.collect()
    before = tasks.rss_trimmed()
    started = time.perf_counter()
    with PeakRss() as sampler:
        seen = call(items(n))
    seconds = time.perf_counter() - started
    assert seen == n, f"{name}: {seen:,} results for {n:,} items"
    out = {"items": n, "seconds": seconds, "rate": n / seconds, "rss_before": before,
           "growth_peak": sampler.peak - before}
    log(f"  {name}: {out['rate']:,.0f} items/s, RSS growth at peak {out['growth_peak'] / MIB:,.1f} MiB")
    return out


def count(stream: Iterator[Any]) -> int:
    k = 0
    for _ in stream:
        k += 1
    return k


def main() -> None:
    p = common.parser("streams", __doc__)
    p.add_argument("--n", type=positive, default=10_000_000, help="no-op items per call")
    p.add_argument("--window", type=positive, default=None, help="imap's window (default: its own)")
    p.add_argument("--skip-unordered", action="store_true", help="run imap and map only")
    args = p.parse_args()
    env = common.environment("streams")
    with local_cluster(args.workers, args.threads) as client, daskqueue_pools(client) as (qp, cp):
        qp.map(tasks.noop, range(10_000))  # warm up, and let the client's imports settle
        list(qp.imap(tasks.noop, range(10_000)))
        runs: dict[str, Any] = {}
        log(f"{args.n:,} no-op items from a generator, per call")
        runs["imap"] = measure("imap", args.n, lambda xs: count(qp.imap(tasks.noop, xs, window=args.window)))
        if not args.skip_unordered:
            runs["imap_unordered"] = measure(
                "imap_unordered", args.n, lambda xs: count(qp.imap_unordered(tasks.noop, xs, window=args.window)))
        runs["map"] = measure("map", args.n, lambda xs: len(qp.map(tasks.noop, xs, timeout_s=3600)))
    base = runs["map"]
    rows = []
    for name in [k for k in runs if k != "map"]:
        r = runs[name]
        rows.append(row(f"client RSS growth at peak, {name}", r["growth_peak"] / MIB, "MiB", "map",
                        base["growth_peak"] / MIB, better="lower", note="target < 100 MB"))
        rows.append(row(f"throughput, {name}", r["rate"], "items/s", "map", base["rate"],
                        note="target >= 0.8x"))
    common.report("streams", args, rows, runs, env=env)


if __name__ == "__main__":
    main()
