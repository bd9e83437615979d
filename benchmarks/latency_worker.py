"""latency_worker: a timeline of one task's path inside the queue's worker, after its put.

``benchmarks.latency_stages`` times the hops of one task between processes; this benchmark
looks inside the worker that holds the queue (and its consumer) at a finer grain. Like it,
it runs ``cp.result(qp.submit(stamp, i))`` one task at a time on an idle 2 x 1
``LocalCluster`` (``--gap-ms`` of idle before each) after wrapping, on the workers only,
the functions named by ``--probe`` (``module:Class.method`` or ``module:function``; sync or
``async``): each wrapper notes the wall clock at its entry and exit. For every sample, each
probe's first entry and exit after the queue's ``put_batch`` ended are taken relative to
that end (the end of the put's body, ``_put_now``, where it has one), and the table gives their median and p90 (ms), in path order: the timeline of
put done -> delivery -> run -> settle -> the client's outcome poll answered.

The default probes name functions of the package as of 12fc79e; a probe that names a
function a tree does not have is skipped (and said so), so the same command runs in the old
and the new tree.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import statistics
import time
from typing import Any

from benchmarks import common
from benchmarks.common import daskqueue_pools, local_cluster, log
from benchmarks.latency_stages import add_sample_args, sample

#: The records of this process: (probe, "in" | "out", wall time).
RECORDS: list[tuple[str, str, float]] = []

DEFAULT_PROBES = [
    "daskqueue.queue.transient:TransientQueue.put_batch",
    "daskqueue.queue.transient:TransientQueue._put_now",
    "daskqueue.queue.leasing:LeasingMixin._wait_ready",
    "daskqueue.queue.transient:TransientQueue.get_batch",
    "daskqueue.consumer.fetching:FetchPolicy._decode",
    "daskqueue.consumer.running:RunSlots._run_and_settle",
    "daskqueue.consumer.running:RunSlots._run",
    "daskqueue.consumer.thread_runner:ThreadRunner._on_thread",
    "daskqueue.consumer.isolate:ProcessRunner.run",
    "daskqueue.consumer.isolate:ProcessRunner._send",
    "daskqueue.consumer.isolate:ProcessRunner._receive",
    "daskqueue.consumer.settling:Settler.settle",
    "daskqueue.queue.transient:TransientQueue.settle",
    "daskqueue.queue.transient:TransientQueue.fetch_outcomes",
    "distributed.comm.tcp:TCP.write",
]


def stamp(x: Any) -> float:
    """The task: the wall clock when it started running."""
    return time.time()


def _wrap(spec: str) -> bool:
    module_name, _, path = spec.partition(":")
    try:
        owner: Any = importlib.import_module(module_name)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        original = inspect.getattr_static(owner, name)
    except (ImportError, AttributeError):
        return False
    if getattr(original, "_dq_probe", False):
        return True
    label = path
    rewrap = None
    if isinstance(original, (staticmethod, classmethod)):
        rewrap, original = type(original), original.__func__
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            RECORDS.append((label, "in", time.time()))
            try:
                return await original(*args, **kwargs)
            finally:
                RECORDS.append((label, "out", time.time()))
    else:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            RECORDS.append((label, "in", time.time()))
            try:
                return original(*args, **kwargs)
            finally:
                RECORDS.append((label, "out", time.time()))
    wrapper._dq_probe = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper if rewrap is None else rewrap(wrapper))
    return True


def install(probes: list[str], loop_trace: bool = False) -> list[str]:
    """On a worker: wrap the probes (idempotent); the ones this tree does not have. With
    ``loop_trace``, also note every callback the event loop runs (``loop:`` records)."""
    if loop_trace:
        _trace_loop()
    return [p for p in probes if not _wrap(p)]


def _trace_loop() -> None:
    import asyncio.events

    handle = asyncio.events.Handle
    if getattr(handle._run, "_dq_probe", False):
        return
    original = handle._run

    def _run(self: Any) -> None:
        cb = self._callback
        owner = getattr(cb, "__self__", None)
        coro = getattr(owner, "get_coro", None)
        name = getattr(coro(), "__qualname__", "?") if coro is not None else getattr(cb, "__qualname__", repr(cb))
        RECORDS.append(("loop:" + name, "in", time.time()))
        try:
            original(self)
        finally:
            RECORDS.append(("loop:" + name, "out", time.time()))

    _run._dq_probe = True  # type: ignore[attr-defined]
    handle._run = _run  # type: ignore[method-assign]


def take() -> list[tuple[str, str, float]]:
    """On a worker: its records so far (loop records tagged with its pid), emptied."""
    import os

    tag = f"loop{os.getpid()}:"
    out = [(tag + lab[5:] if lab.startswith("loop:") else lab, k, t) for lab, k, t in RECORDS]
    RECORDS.clear()
    return out


def _put_done(records: list[tuple[str, str, float]], t0: float) -> float | None:
    """When the put's own work ended: the first exit of ``put_batch`` or of its body
    ``_put_now`` (a put may yield to the long polls it woke before it answers)."""
    return next((t for lab, k, t in records if lab in PUT_LABELS and k == "out" and t >= t0), None)


PUT_LABELS = ("TransientQueue.put_batch", "TransientQueue._put_now")


def timeline(sample: dict[str, float], records: list[tuple[str, str, float]]) -> dict[str, float] | None:
    """Each probe's first entry and exit after the put ended, ms after that end."""
    put_out = _put_done(records, sample["t0"])
    if put_out is None:
        return None
    out: dict[str, float] = {}
    for lab, k, t in records:
        key = f"{lab} {k}"
        if t >= put_out and key not in out:
            out[key] = (t - put_out) * 1000
    out["task started"] = (sample["started"] - put_out) * 1000
    out["result returned in the client"] = (sample["t1"] - put_out) * 1000
    out["submit returned in the client"] = (sample["t_submitted"] - put_out) * 1000
    out["(put done, after submit began)"] = (put_out - sample["t0"]) * 1000
    return out


def _print_trace(sample: dict[str, float], window: list[tuple[str, str, float]]) -> None:
    """The records of one sample from the put's end to the outcome poll's answer, in order."""
    put_out = _put_done(window, sample["t0"])
    if put_out is None:
        return
    end = next((t for lab, k, t in window if lab.endswith("fetch_outcomes") and k == "out" and t > put_out),
               sample["t1"])
    print(f"\n-- one sample: total {1000 * (sample['t1'] - sample['t0']):.2f} ms; task started at "
          f"{1000 * (sample['started'] - put_out):+.3f} ms")
    for lab, k, t in window:
        if put_out - 0.0005 <= t <= end:
            print(f"{1000 * (t - put_out):+8.3f}  {k:3}  {lab}")


def main() -> None:
    p = common.parser("latency_worker", __doc__)
    add_sample_args(p)
    p.add_argument("--probe", action="append", default=None, help="module:Qualified.name (repeatable)")
    p.add_argument("--loop-trace", type=int, default=0, metavar="K",
                   help="also print the event loop's callbacks, put done -> outcome answered, of K samples")
    args = p.parse_args()
    probes = args.probe or DEFAULT_PROBES
    env = common.environment("latency_worker")
    from benchmarks.latency_worker import install, stamp, take

    with local_cluster(args.workers, args.threads) as client:
        missing = client.run(install, probes, bool(args.loop_trace))
        for worker, names in missing.items():
            if names:
                log(f"{worker}: no such function here, not probed: {names}")
        with daskqueue_pools(client, isolation=args.isolation) as (qp, cp):
            samples = sample(client, qp, cp, stamp, take, args)
            per_worker = client.run(take)
    records = sorted((r for recs in per_worker.values() for r in recs), key=lambda r: r[2])
    events: dict[str, list[float]] = {}
    traced = 0
    for k, s in enumerate(samples):
        end = samples[k + 1]["t0"] if k + 1 < len(samples) else s["t1"] + 1
        window = [r for r in records if s["t0"] <= r[2] < end]
        if args.loop_trace and traced < args.loop_trace and k % 37 == 5:
            traced += 1
            _print_trace(s, window)
        tl = timeline(s, [r for r in window if not r[0].startswith("loop")])
        for name, v in (tl or {}).items():
            events.setdefault(name, []).append(v)
    order = sorted(events, key=lambda n: statistics.median(events[n]))
    lines = [[n, f"{statistics.median(events[n]):.3f}", f"{common.percentile(events[n], 90):.3f}",
              str(len(events[n]))] for n in order]
    print(common.render_table(["event (ms after the put ended)", "median", "p90", "samples"], lines, markdown=True))
    rows = [common.row(n, statistics.median(events[n]), "ms", "", None, better="lower") for n in order]
    common.report("latency_worker", args, rows, {"events_ms": {n: common.summary(v) for n, v in events.items()}},
                  env=env)


if __name__ == "__main__":
    main()
