"""ab_rows: several samples per tree of the run_all rows that one sample per run cannot decide.

Two parts in one file:

* ``python benchmarks/ab_rows.py --trees old=/work/wt/old,new=/work/wt/base --rows put100,add_queues
  --runs 3 --samples 3`` (the driver) runs, for each run, one process per tree, old then new
  (old, new, old, new, ...), each taking ``--samples`` samples of every row; then it prints, per
  row and tree, every sample, the median, the spread (min-max) and the ratio of medians new/old,
  with ``uptime``'s load before each process. Run it by path, not with ``-m``: each child gets
  ``PYTHONPATH=<tree>`` and must import that tree's ``daskqueue``, not this checkout's.
* ``--child`` (what the driver starts): the samples of one tree, one JSON line each on stdout.

Rows (each the same code as its run_all benchmark, which is identical in both trees):

* ``put100`` / ``put10k``: ``durable.transient_put_case`` (16 MiB of 100 B / 10 KiB messages,
  1,000 per ``put_batch``, in-process, no Dask), MB/s, beside the same process unpickling the
  same blobs as often and keeping them (what most of a put is); ``dd`` is ``durable.dd_write``
  (16 MiB, ``conv=fdatasync``), the disk baseline with no daskqueue code in it.
* ``putwarm``: ``put100``'s put on warm memory (queues of 100 puts, each dropped before the
  next), us per put, wall and CPU: the code and the copy, without the page faults.
* ``putcode``: ``put100``'s put without its unpickling (``decode_put`` answers from a cache),
  CPU us per put, the collector off: the queue's own code per ``put_batch``.
* ``putctx``: ``put100`` where run_all's ``durable`` takes it (after its ``dd`` and raw
  writes, the process's first daskqueue put), then again: the first run and the later ones.
* ``putcall``: the put path's own code, us per ``put_batch`` of 10 messages of 10 B.
* ``add_queues``: ``routing.measured_moves``'s calls (a transient pool of n=2 on 2 workers,
  50,000 keyed messages, ``add_queues(1)``): seconds of the call and of the put, and the CPU
  seconds of every process in each (CPU moves less with the machine's load than wall time).
* ``failover``: ``failover.fail_over`` (durable pool of 2 queues on 3 workers, 20,000 messages,
  SIGKILL of queue 1's worker): kill -> serving, excluding detection, and total. The churn
  row runs the same function on the same cluster shape.
* ``idle``: the scheduler's process CPU (it holds the client too) over a 3 s window on a 2-worker
  cluster, with no actors, then with a started QueuePool + ConsumerPool whose queues are empty
  (``idle.cpu_window``), % of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROWS = ("put100", "put10k", "putcall", "putwarm", "putcode", "putctx", "dd", "add_queues", "failover", "idle")
# Lower is better for these measures; higher for the rest (MB/s).
LOWER_BETTER = {"putctx.first_page_faults", "putctx.later_page_faults", "putcode.cpu_us_per_put", "putwarm.page_faults_per_put", "putwarm.us_per_put", "putwarm.cpu_us_per_put", "add_queues.add_cpu_s", "add_queues.put_cpu_s", "putcall.us_per_put", "add_queues.add_s", "add_queues.put_s", "failover.reopen_s", "failover.serving_s",
                "failover.detection_s", "idle.scheduler_pct", "idle.scheduler_base_pct", "idle.added_pct"}


# -- the child: samples of one tree ------------------------------------------------------------


def _emit(row: str, values: dict[str, float]) -> None:
    print(json.dumps({"row": row, **values}), flush=True)


def _child_put(samples: int, size: int, row: str) -> None:
    from benchmarks.durable import put_blob, transient_put_case

    total = 16 * 2**20
    blob = put_blob(os.urandom(size), 1000)
    puts = max(1, total // (size * 1000))
    for _ in range(samples):
        r = asyncio.run(transient_put_case(size, total, 1000))
        # Baseline, same process, right after: unpickle the same blob as often, keeping every
        # copy as the queue keeps its messages. Most of a put is this copy into fresh memory
        # (page faults), which the machine's load moves, not daskqueue's code.
        t0 = time.perf_counter()
        held = [pickle.loads(blob) for _ in range(puts)]
        base_s = time.perf_counter() - t0
        del held
        base = puts * 1000 * size / base_s / 1e6
        _emit(row, {"mb_per_s": r["mb_per_s"], "unpickle_mb_per_s": base, "queue_over_unpickle": r["mb_per_s"] / base})


def _child_putcall(samples: int) -> None:
    """The put path's own code: us per ``put_batch`` of 10 messages of 10 B (no copy to speak of)."""
    from benchmarks.durable import put_blob
    from daskqueue.queue.transient import TransientQueue

    blob = put_blob(os.urandom(10), 10)

    async def one() -> float:
        q = TransientQueue(0)
        await q.put_batch(blob)
        t0 = time.perf_counter()
        for _ in range(20_000):
            await q.put_batch(blob)
        seconds = time.perf_counter() - t0
        await q.close()
        return seconds / 20_000 * 1e6

    for _ in range(samples):
        _emit("putcall", {"us_per_put": asyncio.run(one())})


def _child_putwarm(samples: int) -> None:
    """``put100``'s put path on warm memory: us per ``put_batch`` of 1,000 messages of 100 B,
    20 queues of 100 puts each, every queue dropped before the next (its memory is reused, so
    no page faults: what remains is the code and the copy). Wall and CPU time."""
    from benchmarks.durable import put_blob
    from daskqueue.queue.transient import TransientQueue

    blob = put_blob(os.urandom(100), 1000)

    async def one() -> tuple[float, float, float]:
        wall = cpu = 0.0
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            q = TransientQueue(0)
            await q.put_batch(blob)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(100):
                await q.put_batch(blob)
            wall += time.perf_counter() - t0
            cpu += time.process_time() - c0
            await q.close()
            del q
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        return wall / 2000 * 1e6, cpu / 2000 * 1e6, faults / 2000

    asyncio.run(one())  # warm the heap
    for _ in range(samples):
        wall, cpu, faults = asyncio.run(one())
        _emit("putwarm", {"us_per_put": wall, "cpu_us_per_put": cpu, "page_faults_per_put": faults})


def _child_putcode(samples: int) -> None:
    """``put100``'s put path without its unpickling: CPU us per ``put_batch`` of one group of
    1,000 messages, ``decode_put`` answering from a cache (patched wherever the tree imported
    it), the collector off (its passes land on whichever put allocates last). 20 queues of
    100 puts per sample."""
    import gc

    from benchmarks.durable import put_blob
    from daskqueue.queue.transient import TransientQueue
    from daskqueue.serialize import decode_put

    blob = put_blob(os.urandom(100), 1000)
    funcs, groups = decode_put(blob)

    def cached(_blob: bytes) -> tuple[dict[bytes, bytes], list[Any]]:
        return dict(funcs), list(groups)

    patched = [mod for name, mod in list(sys.modules.items())
               if name.startswith("daskqueue") and getattr(mod, "decode_put", None) is decode_put]
    for mod in patched:
        mod.decode_put = cached  # type: ignore[attr-defined]

    async def one() -> float:
        cpu = 0.0
        for _ in range(20):
            q = TransientQueue(0)
            await q.put_batch(blob)
            c0 = time.process_time()
            for _ in range(100):
                await q.put_batch(blob)
            cpu += time.process_time() - c0
            await q.close()
        return cpu / 2000 * 1e6

    gc.disable()
    try:
        asyncio.run(one())
        for _ in range(samples):
            _emit("putcode", {"cpu_us_per_put": asyncio.run(one())})
    finally:
        gc.enable()
        for mod in patched:  # the rows after this one put for real
            mod.decode_put = decode_put  # type: ignore[attr-defined]


def _child_putctx(samples: int) -> None:
    """``put100`` where run_all's ``durable`` takes it: after three ``dd`` runs and the raw
    write loops of the 100 B case, in a process whose first daskqueue put this is; then
    ``samples`` - 1 more. MB/s and minor page faults of each run, in order (the first is the
    one run_all's single sample reported)."""
    from benchmarks.durable import dd_write, raw_write, transient_put_case

    total = 16 * 2**20
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for _ in range(3):
            dd_write(d / "dd.bin", 16)
        block = os.urandom(100 * 1000)
        blocks = max(1, total // len(block))
        for _ in range(3):
            raw_write(d / "raw.bin", block, blocks, fsync_each=False)
        for _ in range(3):
            raw_write(d / "raw.bin", block, max(1, blocks // 4), fsync_each=True)
    for i in range(samples):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        r = asyncio.run(transient_put_case(100, total, 1000))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        key = "first" if i == 0 else "later"
        _emit("putctx", {f"{key}_mb_per_s": r["mb_per_s"], f"{key}_page_faults": faults})


def _child_dd(samples: int) -> None:
    from benchmarks.durable import dd_write

    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(samples):
            _emit("dd", {"mb_per_s": dd_write(Path(tmp) / "dd.bin", 16)["mb_per_s"]})


def _child_add_queues(samples: int) -> None:
    """``routing.measured_moves`` for n=2 (the same calls), plus the CPU seconds every process
    spent in the put and in ``add_queues``: CPU time moves less with the machine's load than
    wall time does."""
    from benchmarks import tasks
    from benchmarks.common import local_cluster
    from daskqueue import QueuePool

    keys = [f"key-{i}" for i in range(50_000)]

    def cpu(client: Any) -> float:
        w = client.run(tasks.cpu_seconds)
        return sum(u + s for u, s, _ in w.values()) + sum(tasks.cpu_seconds()[:2])

    with local_cluster(2) as client:
        for _ in range(samples):
            qp = QueuePool(client, 2)
            try:
                c0, t0 = cpu(client), time.perf_counter()
                qp.put_many(range(len(keys)), keys=keys)
                t1 = time.perf_counter()
                c1 = cpu(client)
                t2 = time.perf_counter()
                qp.add_queues(1)
                t3 = time.perf_counter()
                c2 = cpu(client)
                assert sum(s.ready for s in qp.stats()) == len(keys), "a message went missing"
            finally:
                qp.close()
            _emit("add_queues", {"add_s": t3 - t2, "put_s": t1 - t0, "add_cpu_s": c2 - c1, "put_cpu_s": c1 - c0})


def _child_failover(samples: int) -> None:
    from benchmarks.common import local_cluster
    from benchmarks.failover import fail_over

    with tempfile.TemporaryDirectory() as tmp, local_cluster(3) as client:
        for i in range(samples):
            client.wait_for_workers(3, timeout=120)
            d = fail_over(client, 20_000, os.path.join(tmp, f"pool-{i}"))
            _emit("failover", {"reopen_s": d["reopen_s"], "serving_s": d["serving_s"],
                               "detection_s": d["detection_s"]})
            # the nanny restarts the killed worker; wait for it so every sample starts alike
            deadline = time.monotonic() + 60
            while len(client.scheduler_info()["workers"]) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)


def _child_idle(samples: int) -> None:
    from benchmarks import tasks
    from benchmarks.common import daskqueue_pools, local_cluster
    from benchmarks.idle import cpu_window

    with local_cluster(2) as client:
        client.gather(client.map(tasks.noop, range(20)))
        for _ in range(samples):
            time.sleep(1.0)
            base = cpu_window(client, 3.0)
            with daskqueue_pools(client) as (qp, _cp):
                qp.map(tasks.noop, range(100))
                time.sleep(1.0)
                w = cpu_window(client, 3.0)
            _emit("idle", {"scheduler_pct": w["scheduler_process_pct"],
                           "scheduler_base_pct": base["scheduler_process_pct"],
                           "added_pct": w["scheduler_process_pct"] - base["scheduler_process_pct"]})


CHILD: dict[str, Callable[[int], None]] = {
    "put100": lambda n: _child_put(n, 100, "put100"),
    "put10k": lambda n: _child_put(n, 10 * 1024, "put10k"),
    "putcall": _child_putcall,
    "putwarm": _child_putwarm,
    "putcode": _child_putcode,
    "putctx": _child_putctx,
    "dd": _child_dd,
    "add_queues": _child_add_queues,
    "failover": _child_failover,
    "idle": _child_idle,
}


# -- the driver ----------------------------------------------------------------------------------


def _load() -> str:
    return "%.2f %.2f %.2f" % os.getloadavg()


def _run_child(tree: str, rows: list[str], samples: int, timeout: float) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": tree}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--rows", ",".join(rows),
           "--samples", str(samples)]
    # cwd=tree: `benchmarks` and `daskqueue` both come from the tree (identical benchmark code)
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit(f"child in {tree} failed ({out.returncode})")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _mann_whitney(a: list[float], b: list[float]) -> float:
    """Two-sided p-value that ``a`` and ``b`` come from one distribution (NaN without scipy):
    a ratio of medians with p well above 0.05 is the trees' noise, not a difference."""
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:
        return float("nan")
    return float(mannwhitneyu(a, b).pvalue) if a and b else float("nan")


def _fmt(v: float) -> str:
    return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--trees", default="old=/work/wt/old,new=/work/wt/base",
                   help="name=path,... in the order each run visits them")
    p.add_argument("--rows", default="put100,dd", help=f"comma-separated, of {', '.join(ROWS)}")
    p.add_argument("--runs", type=int, default=3, help="alternated processes per tree")
    p.add_argument("--samples", type=int, default=3, help="samples per row and process")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    p.add_argument("--json", default=None, help="write every sample here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    bad = set(rows) - set(ROWS)
    if bad:
        p.error(f"unknown rows: {', '.join(sorted(bad))}")
    if args.child:
        for r in rows:
            CHILD[r](args.samples)
        return

    trees = [t.split("=", 1) for t in args.trees.split(",")]
    samples: dict[str, dict[str, dict[str, list[float]]]] = {}  # row.measure -> tree -> values
    log: list[dict[str, Any]] = []
    for run in range(args.runs):
        for name, path in trees:
            load = _load()
            t0 = time.perf_counter()
            got = _run_child(path, rows, args.samples, args.timeout)
            log.append({"run": run + 1, "tree": name, "load_before": load, "seconds": time.perf_counter() - t0,
                        "samples": got})
            print(f"run {run + 1} {name:4s} load {load}: " + "; ".join(
                f"{s['row']} " + " ".join(f"{k}={_fmt(v)}" for k, v in s.items() if k != "row") for s in got),
                flush=True)
            for s in got:
                for k, v in s.items():
                    if k != "row":
                        samples.setdefault(f"{s['row']}.{k}", {}).setdefault(name, []).append(v)
    print(f"\nload at the end: {_load()}\n")
    names = [n for n, _ in trees]
    print("| measure | " + " | ".join(f"{n}: samples, median (min-max)" for n in names)
          + f" | {names[-1]} / {names[0]} (medians) | Mann-Whitney p |")
    print("|---|" + "---|" * len(names) + "---|---|")
    summary = {}
    for measure, by_tree in samples.items():
        cells, medians = [], []
        for n in names:
            vals = by_tree.get(n, [])
            med = statistics.median(vals) if vals else float("nan")
            medians.append(med)
            cells.append(f"{', '.join(_fmt(v) for v in vals)}; **{_fmt(med)}** ({_fmt(min(vals))}-{_fmt(max(vals))})")
        ratio = medians[-1] / medians[0] if medians[0] else float("nan")
        better = "lower" if measure in LOWER_BETTER else "higher"
        p_value = _mann_whitney(by_tree.get(names[0], []), by_tree.get(names[-1], []))
        summary[measure] = {"medians": dict(zip(names, medians)), "ratio": ratio, "better": better, "p": p_value}
        print(f"| {measure} ({better} is better) | " + " | ".join(cells) + f" | {ratio:.2f}x | {p_value:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv, "trees": dict(trees), "runs": log,
                                               "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
