"""latency_stages: where one task's submit -> result time goes, hop by hop.

One task at a time on an idle 2 x 1 ``LocalCluster`` (``--gap-ms`` of idle before each, as in
``benchmarks.latency``): ``cp.result(qp.submit(stamp, i))``. Before the pools exist, every
worker gets wrappers (``client.run``) around the methods one task passes through, which note
the wall clock (``time.time()``: one host, one clock for every process) at their entry and
exit:

* queue actor: ``put_batch`` (the client's put), ``get_batch`` (a consumer's long poll; only
  calls that return a delivery mark a stage), ``settle``, ``fetch_outcomes`` (the client's
  outcome long poll);
* consumer actor: ``ProcessRunner.run`` (the child-process hop of ``isolation="auto"``; with
  ``--isolation thread`` there is none) and ``Settler.settle``;
* the task itself returns the time it started (in the child process).

The wrappers live only in this benchmark's workers: the package's hot path carries no timer.
Each sample's records are matched to it by time (samples never overlap) and turned into
stage durations; the table gives the median and p90 of each stage over the samples, and
how many calls of each kind one task caused (the hops).
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

from benchmarks import common
from benchmarks.common import daskqueue_pools, local_cluster, log, positive

#: The records of this process: (what, "in" | "out", wall time, answered something).
RECORDS: list[tuple[str, str, float, bool]] = []


def stamp(x: Any) -> float:
    """The task: the wall clock when it started running."""
    return time.time()


def _answered(label: str, result: Any) -> bool:
    """Whether a call's answer carried something: a delivery (not ``None`` or hints), or
    outcomes (a non-empty pickled list of results, or dead letters)."""
    if label == "q.get_batch":
        return isinstance(result, (bytes, bytearray))
    if label == "q.fetch_outcomes":
        return len(result[1]) > 8 or bool(result[3])
    return result is not None


def _wrap(cls: type, name: str, label: str) -> None:
    original = getattr(cls, name)
    if getattr(original, "_dq_stage", False):
        return

    @functools.wraps(original)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        RECORDS.append((label, "in", time.time(), True))
        result = await original(*args, **kwargs)
        RECORDS.append((label, "out", time.time(), _answered(label, result)))
        return result

    wrapper._dq_stage = True  # type: ignore[attr-defined]
    setattr(cls, name, wrapper)


def install() -> int:
    """On a worker: wrap the methods of one task's path (idempotent). Returns the pid."""
    import os

    from daskqueue.consumer.isolate import ProcessRunner
    from daskqueue.consumer.settling import Settler
    from daskqueue.queue.transient import TransientQueue

    for name, label in [("put_batch", "q.put_batch"), ("get_batch", "q.get_batch"),
                        ("settle", "q.settle"), ("fetch_outcomes", "q.fetch_outcomes")]:
        _wrap(TransientQueue, name, label)
    _wrap(ProcessRunner, "run", "c.child_run")
    _wrap(Settler, "settle", "c.settle")
    return os.getpid()


def take() -> list[tuple[str, str, float, bool]]:
    """On a worker: its records so far, emptied."""
    out = list(RECORDS)
    RECORDS.clear()
    return out


def first(records: list[tuple[str, str, float, bool]], label: str, kind: str, after: float,
          answered: bool | None = None) -> float | None:
    for lab, k, t, ans in records:
        if lab == label and k == kind and t >= after and (answered is None or ans == answered):
            return t
    return None


def stages_of(sample: dict[str, float], records: list[tuple[str, str, float, bool]]) -> dict[str, float] | None:
    """Stage durations (ms) of one sample from the records inside its time window."""
    t0, t_sub, t1, started = sample["t0"], sample["t_submitted"], sample["t1"], sample["started"]
    put_in = first(records, "q.put_batch", "in", t0)
    put_out = first(records, "q.put_batch", "out", t0)
    got = first(records, "q.get_batch", "out", t0, answered=True)
    run_in = first(records, "c.child_run", "in", t0)
    run_out = first(records, "c.child_run", "out", t0)
    settle_in = first(records, "q.settle", "in", t0)
    settle_out = first(records, "q.settle", "out", t0)
    fo_out = first(records, "q.fetch_outcomes", "out", settle_out or t1, answered=True) if settle_out else None
    if None in (put_in, put_out, got, settle_in, settle_out, fo_out):
        return None
    ms = lambda a, b: (b - a) * 1000  # noqa: E731
    out = {
        "1 client: submit call until the queue's put_batch starts": ms(t0, put_in),
        "2 queue: put_batch": ms(put_in, put_out),
        "3 put_batch answer back in the client (submit returns)": ms(put_out, t_sub),
        "4 put done -> the consumer's long poll returns the delivery": ms(put_out, got),
    }
    if run_in is not None and run_out is not None:
        out["5 consumer: delivery -> hands the batch to its child"] = ms(got, run_in)
        out["6 child hop in: hand-over -> the task starts in the child"] = ms(run_in, started)
        out["7 child hop out: task start -> the child's outcome is back"] = ms(started, run_out)
        out["8 consumer: outcome back -> settle reaches the queue"] = ms(run_out, settle_in)
    else:
        out["5-7 consumer: delivery -> the task starts (thread)"] = ms(got, started)
        out["8 consumer: task start -> settle reaches the queue"] = ms(started, settle_in)
    out["9 queue: settle"] = ms(settle_in, settle_out)
    # The client's outcome poll runs beside the consumer's path: when did the poll that
    # answered reach the queue, after the put was done (compare with the settle's end)?
    fo_in = max((t for lab, k, t, _ in records if lab == "q.fetch_outcomes" and k == "in" and t <= fo_out),
                default=None)
    if fo_in is not None:
        out["a put done -> the client's outcome poll reaches the queue"] = ms(put_out, fo_in)
        out["b put done -> settle done (the consumer's path)"] = ms(put_out, settle_out)
        out["c the poll waited for the settle (1) or the settle for the poll (0)"] = float(fo_in < settle_out)
    out["10 settle done -> the client's outcome poll answers"] = ms(settle_out, fo_out)
    out["11 outcome answer back in the client (result returns)"] = ms(fo_out, t1)
    out["total submit -> result"] = ms(t0, t1)
    return out


def calls_in(records: list[tuple[str, str, float, bool]], t0: float, t1: float) -> dict[str, int]:
    """How many calls of each kind began inside ``[t0, t1]``."""
    counts: dict[str, int] = {}
    for lab, k, t, _ in records:
        if k == "in" and t0 <= t <= t1:
            counts[lab] = counts.get(lab, 0) + 1
    return counts


def _order(stage: str) -> tuple[int, int | str]:
    """Stages in path order ("5-7 ..." sorts as 5), the total, then the lettered overlaps."""
    if stage[0].isdigit():
        return 0, int(stage.split()[0].split("-")[0])
    return (1, 0) if stage.startswith("total") else (2, stage)


def sample(client: Any, qp: Any, cp: Any, task: Any, drop: Any, args: Any) -> list[dict[str, float]]:
    """``args.n`` single tasks ``cp.result(qp.submit(task, i))``, ``args.gap_ms`` idle before
    each, after ``args.warmup`` untimed ones (whose worker records ``drop`` clears): the
    client's wall clock at submit, submitted, result, and what the task returned."""
    for i in range(args.warmup):
        cp.result(qp.submit(task, -i), timeout=60)
    client.run(drop)
    samples: list[dict[str, float]] = []
    for i in range(args.n):
        time.sleep(args.gap_ms / 1000)
        t0 = time.time()
        tid = qp.submit(task, i)
        t_sub = time.time()
        started = cp.result(tid, timeout=60)
        t1 = time.time()
        samples.append({"t0": t0, "t_submitted": t_sub, "t1": t1, "started": started})
    return samples


def add_sample_args(p: Any) -> None:
    """The sampling options shared with ``latency_worker``: --n, --warmup, --gap-ms, --isolation."""
    p.add_argument("--n", type=positive, default=200, help="samples")
    p.add_argument("--warmup", type=int, default=20, help="untimed samples first")
    p.add_argument("--gap-ms", type=float, default=20.0, help="idle pause before every sample")
    p.add_argument("--isolation", default="auto", help="consumers' isolation (auto: a child process)")


def main() -> None:
    p = common.parser("latency_stages", __doc__)
    add_sample_args(p)
    args = p.parse_args()
    env = common.environment("latency_stages")
    # By reference (run as __main__, cloudpickle would send copies with their own RECORDS)
    from benchmarks.latency_stages import install, stamp, take

    with local_cluster(args.workers, args.threads) as client:
        pids = client.run(install)
        log(f"stage wrappers installed on {len(pids)} workers")
        with daskqueue_pools(client, isolation=args.isolation) as (qp, cp):
            samples = sample(client, qp, cp, stamp, take, args)
            per_worker = client.run(take)
    records = sorted((r for recs in per_worker.values() for r in recs), key=lambda r: r[2])
    per_stage: dict[str, list[float]] = {}
    calls: dict[str, list[int]] = {}
    matched = 0
    for k, s in enumerate(samples):
        end = samples[k + 1]["t0"] if k + 1 < len(samples) else s["t1"] + 1
        window = [r for r in records if s["t0"] <= r[2] < end]
        st = stages_of(s, window)
        for lab, c in calls_in(records, s["t0"], s["t1"]).items():
            calls.setdefault(lab, []).append(c)
        if st is None:
            continue
        matched += 1
        for name, v in st.items():
            per_stage.setdefault(name, []).append(v)
    log(f"{matched} of {len(samples)} samples matched to their records")
    print()
    header = ["stage", "median ms", "p90 ms", "share of median total"]
    total = statistics.median(per_stage["total submit -> result"]) if per_stage else float("nan")
    lines = []
    for name in sorted(per_stage, key=_order):
        v = per_stage[name]
        med = statistics.median(v)
        if name.startswith("c "):  # a 0/1 flag: its mean is the share of samples
            lines.append([name, f"{statistics.mean(v):.2f} of samples", "", ""])
            continue
        lines.append([name, f"{med:.3f}", f"{common.percentile(v, 90):.3f}", f"{100 * med / total:.0f}%"])
    print(common.render_table(header, lines, markdown=True))
    print()
    hop_lines = [[lab, f"{statistics.mean(v):.2f}", str(max(v))] for lab, v in sorted(calls.items())]
    print(common.render_table(["calls begun per task (inside submit -> result)", "mean", "max"], hop_lines,
                              markdown=True))
    summary = {name: common.summary(v) for name, v in per_stage.items()}
    rows = [common.row(name, summary[name]["p50"], "ms", "total submit -> result p50", total, better="lower")
            for name in sorted(summary, key=_order)]
    common.report("latency_stages", args, rows,
                  {"stages_ms": summary, "calls_per_task": {k: statistics.mean(v) for k, v in calls.items()},
                   "samples": samples, "matched": matched}, env=env)


if __name__ == "__main__":
    main()
