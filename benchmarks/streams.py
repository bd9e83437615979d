"""streams: ``imap`` / ``imap_unordered`` against ``map`` over one generator of N no-op items.

In one run, on one cluster and pool: ``imap``, ``imap_unordered`` and ``map`` (the baseline)
each take a fresh generator of N (default 10,000,000) no-op items and return or yield every
result. Reported per call: throughput (items/s; a stream's includes the loop that consumes
it) and the client's RSS growth, the peak of a sampling thread (``VmRSS`` of
``/proc/self/status`` every 20 ms) minus the RSS just before the call (after ``gc`` and
``malloc_trim``), and the client process's CPU seconds per item (steadier than throughput on
a shared machine). With ``--rounds R`` the sequence runs R times, each round starting one
call later (imap, imap_unordered, map; then imap_unordered, map, imap; ...), and each call's
fastest round is reported. A stream that runs after ``map`` may reuse memory ``map`` freed
and the allocator kept (not counted as growth): the first round, where the streams run
before ``map``, gives their honest growth. Targets (issue 23): a stream's RSS growth under
100 MB and at least 0.8x ``map``'s throughput.
"""

from __future__ import annotations

import gc
import os
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
    cpu0 = tasks.cpu_seconds()
    started = time.perf_counter()
    with PeakRss() as sampler:
        seen = call(items(n))
    seconds = time.perf_counter() - started
    cpu1 = tasks.cpu_seconds()
    assert seen == n, f"{name}: {seen:,} results for {n:,} items"
    cpu_s = (cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1])
    out = {"items": n, "seconds": seconds, "rate": n / seconds, "rss_before": before,
           "growth_peak": sampler.peak - before, "client_cpu_s": cpu_s, "client_cpu_us_per_item": cpu_s / n * 1e6,
           "load_average": list(os.getloadavg())}
    log(f"  {name}: {out['rate']:,.0f} items/s, RSS growth at peak {out['growth_peak'] / MIB:,.1f} MiB, "
        f"client CPU {out['client_cpu_us_per_item']:.2f} us/item, load {out['load_average'][0]:.1f}")
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
    p.add_argument("--rounds", type=positive, default=1,
                   help="run the sequence this many times (the machine is shared: the best round of each is reported)")
    args = p.parse_args()
    env = common.environment("streams")
    with local_cluster(args.workers, args.threads) as client, daskqueue_pools(client) as (qp, cp):
        qp.map(tasks.noop, range(10_000))  # warm up, and let the client's imports settle
        list(qp.imap(tasks.noop, range(10_000)))
        rounds: list[dict[str, Any]] = []
        log(f"{args.n:,} no-op items from a generator, per call")
        calls = {
            "imap": lambda xs: count(qp.imap(tasks.noop, xs, window=args.window)),
            "imap_unordered": lambda xs: count(qp.imap_unordered(tasks.noop, xs, window=args.window)),
            "map": lambda xs: len(qp.map(tasks.noop, xs, timeout_s=3600)),
        }
        if args.skip_unordered:
            del calls["imap_unordered"]
        names = list(calls)
        for r in range(args.rounds):
            # Each round starts one call later: the machine's load drifts within a round, and
            # no call should always run first (or last).
            order = names[r % len(names):] + names[: r % len(names)]
            rounds.append({name: measure(name, args.n, calls[name]) for name in order})
    # Each call's best round (fastest; its own RSS growth): the machine's load varies more
    # between calls than the calls differ.
    runs = {name: max((r[name] for r in rounds), key=lambda x: x["rate"]) for name in rounds[0]}
    base = runs["map"]
    rows = []
    for name in [k for k in runs if k != "map"]:
        r = runs[name]
        rows.append(row(f"client RSS growth at peak, {name}", r["growth_peak"] / MIB, "MiB", "map",
                        base["growth_peak"] / MIB, better="lower", note="target < 100 MB"))
        rows.append(row(f"throughput, {name}", r["rate"], "items/s", "map", base["rate"],
                        note="target >= 0.8x"))
        rows.append(row(f"client CPU per item, {name}", r["client_cpu_us_per_item"], "us", "map",
                        base["client_cpu_us_per_item"], better="lower"))
    common.report("streams", args, rows, {"best": runs, "rounds": rounds}, env=env)


if __name__ == "__main__":
    main()
