"""floor: what the API itself asks of the client per task, beside ``map``, in one run (issue 24).

``batch_submit`` + ``join`` + ``results`` must check that every task is ``(func, *args)``, return
a list of N ids and then a dict of N results; ``as_completed`` over ``batch_submit``'s chunks
gets those lists of ids too and yields N ``(id, outcome)`` pairs. ``map`` asks none of that: its
input is a range, its output a list filled by slices. This measures those steps alone, in this
process with nothing else running (``mandated``: the least CPU any implementation of the API
spends on them, done the fastest way known here, in C), then, on a 2 x 1 ``LocalCluster``, the
wall time and the CPU of the client process and of the workers' processes (``psutil``) for
``map``, ``as_completed`` (chunks of ``--chunk``, two in flight, as in ``shapes.py``) and
``batch_submit + join + results``, alternated over ``--rounds``.

Two ceilings on a shape's rate as a fraction of ``map``'s, both generous (they assume the
shape does nothing beyond ``map``'s work but the mandated steps):

* ``on this machine``: the lesser of ``map``'s measured wall against (a) the shape's least CPU
  (``map``'s, client and workers, plus the mandated steps) spread over the cores with no loss,
  and (b) the shape's least client CPU (``map``'s plus the mandated steps, most of it on one
  thread);
* ``client-bound machine``: where cores are to spare and ``map`` runs as fast as its client's
  CPU allows: ``map``'s client CPU against that plus the mandated steps.

A target above both cannot be met by any implementation of the API on this machine.
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import pickle
import statistics
import time
from operator import itemgetter
from typing import Any, Callable

import psutil

from benchmarks import tasks
from benchmarks.common import daskqueue_pools, environment, local_cluster, log, parser, positive, report, row

second = itemgetter(1)


def best_of(fn: Callable[[], Any], repeat: int = 5) -> float:
    """The least CPU time of ``fn()`` over ``repeat`` calls (what it costs with no contention)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
        del out
    return best


def mandated(n: int, chunk: int) -> dict[str, float]:
    """CPU seconds of each per-task step the API asks of the client, for ``n`` tasks."""
    from daskqueue.messages import id_range
    from daskqueue.queue.encode import _pairs_of_one_function

    batch = [(tasks.noop, i) for i in range(n)]
    half = n // 2
    # Results arrive as pickled lists of ~1,000 values per settle, from two queues.
    blobs = [(q, s, pickle.dumps(list(range(s, min(s + 1000, half))), 5)) for q in (0, 1)
             for s in range(0, half, 1000)]
    values = [(q, s, pickle.loads(b)) for q, s, b in blobs]

    def results_dict() -> dict[int, Any]:
        d: dict[int, Any] = {}
        for q, s, v in values:
            d.update(zip(id_range(q, s, len(v)), v))
        return d

    ids = list(itertools.chain(id_range(0, 0, half), id_range(1, 0, n - half)))
    flat = list(itertools.chain.from_iterable(v for _, _, v in values))
    steps = {
        "check (func, x) tasks": best_of(lambda: _pairs_of_one_function(batch)),
        "list of ids": best_of(lambda: list(itertools.chain(id_range(0, 0, half), id_range(1, 0, n - half)))),
        "dict of results": best_of(results_dict),
        # taken one by one and dropped, as ``sum(map(second, cp.as_completed(ids)))`` takes them
        "(id, outcome) pairs": best_of(lambda: collections.deque(zip(ids, flat), maxlen=0)),
    }
    assert len(results_dict()) == n
    return steps


def run_cluster(n: int, rounds: int, chunk: int) -> dict[str, list[dict[str, float]]]:
    me = psutil.Process()
    out: dict[str, list[dict[str, float]]] = {"map": [], "as_completed": [], "submit_join_results": []}
    with local_cluster(2, 1) as client, daskqueue_pools(client) as (qp, cp):
        qp.map(tasks.noop, range(2000))
        kids = me.children(recursive=True)  # now: the consumers' child processes too

        def cpu() -> tuple[float, float]:
            t = me.cpu_times()
            w = 0.0
            for k in kids:
                try:
                    kt = k.cpu_times()
                    w += kt.user + kt.system
                except psutil.Error:
                    pass
            return t.user + t.system, w

        def run_map() -> None:
            assert sum(qp.map(tasks.noop, range(n))) == n * (n - 1) // 2

        def run_as_completed() -> None:
            pending: list[list[int]] = []
            done = 0
            for b in batches:
                pending.append(qp.batch_submit(b))
                if len(pending) >= 2:
                    done += sum(map(second, cp.as_completed(pending.pop(0), timeout=600)))
            for ids in pending:
                done += sum(map(second, cp.as_completed(ids, timeout=600)))
            assert done == n * (n - 1) // 2

        def run_sjr() -> None:
            ids = qp.batch_submit(batch)
            cp.join(timeout=600)
            res = qp.results(clear=True)
            assert len(res) == n and res[ids[-1]] == n - 1

        runs = {"map": run_map, "as_completed": run_as_completed, "submit_join_results": run_sjr}
        for r in range(rounds):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            for name in order:
                # the user's own data, built before the clock starts
                batches = [[(tasks.noop, i) for i in range(a, min(n, a + chunk))] for a in range(0, n, chunk)]
                batch = [t for b in batches for t in b]
                gc.collect()
                c0, w0 = cpu()
                t0 = time.perf_counter()
                runs[name]()
                wall = time.perf_counter() - t0
                c1, w1 = cpu()
                out[name].append({"wall_s": wall, "client_cpu_s": c1 - c0, "workers_cpu_s": w1 - w0})
                log(f"round {r + 1} {name}: {n / wall:,.0f}/s, client {c1 - c0:.3f} CPU-s, "
                    f"workers {w1 - w0:.3f} CPU-s")
                del batches, batch
    return out


def main() -> None:
    p = parser("floor", __doc__)
    p.add_argument("--n", type=positive, default=1_000_000, help="tasks per run")
    p.add_argument("--rounds", type=positive, default=3, help="alternated rounds of the three shapes")
    p.add_argument("--chunk", type=positive, default=100_000, help="as_completed: batch_submit chunk")
    args = p.parse_args()
    env = environment("floor")
    n = args.n
    steps = mandated(n, args.chunk)
    for k, v in steps.items():
        log(f"mandated, {k}: {v:.3f} CPU-s per {n:,}")
    extra = {
        "as_completed": steps["check (func, x) tasks"] + steps["list of ids"] + steps["(id, outcome) pairs"],
        "submit_join_results": steps["check (func, x) tasks"] + steps["list of ids"] + steps["dict of results"],
    }
    measured = run_cluster(n, args.rounds, args.chunk)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in measured.items()}
    m = med["map"]
    cores = os.cpu_count() or 1
    rows = []
    for name in ("as_completed", "submit_join_results"):
        ratios = [mr["wall_s"] / sr["wall_s"] for mr, sr in zip(measured["map"], measured[name])]
        least_cpu = m["client_cpu_s"] + m["workers_cpu_s"] + extra[name]
        here = min(m["wall_s"] / (least_cpu / cores),  # all of it spread over the cores, no loss
                   m["wall_s"] / (m["client_cpu_s"] + extra[name]))  # the client's own CPU, one thread
        client_bound = m["client_cpu_s"] / (m["client_cpu_s"] + extra[name])
        rows.append(row(f"{name} / map, measured (median of {len(ratios)})", statistics.median(ratios), "x map",
                        "target", 0.8, note="per round " + " / ".join(f"{x:.2f}" for x in ratios)))
        rows.append(row(f"{name}: ceiling on this machine", here, "x map", "target", 0.8,
                        note=f"mandated {extra[name]:.3f} CPU-s per {n:,}"))
        rows.append(row(f"{name}: ceiling, client-bound machine", client_bound, "x map", "target", 0.8))
    for name, r in med.items():
        log(f"median {name}: wall {r['wall_s']:.3f} s, client {r['client_cpu_s']:.3f}, "
            f"workers {r['workers_cpu_s']:.3f} CPU-s")
    report("floor", args, rows, {"mandated": steps, "measured": measured, "medians": med}, env=env)


if __name__ == "__main__":
    main()
