"""submit: enqueue rate alone, ``qp.batch_submit`` of N tasks with no consumers.

Two task functions: a module function (``benchmarks.tasks.noop``, pickled by reference) and a
function defined in this script, which is ``__main__.main_noop`` when run with
``python -m benchmarks.submit``, so cloudpickle ships it by value. Payload bytes are the sum
of the ``put_batch`` blob sizes (counted by wrapping ``encode_put`` in this process).

Each variant runs ``--repeat`` times, alternating, and the best run is reported (all runs are
in the JSON). Baseline in the same run: a plain local loop of ``pickle.dumps((func, args))`` per task (the
per-task pickle ceiling); for the ``__main__`` function also ``cloudpickle.dumps`` per task
on a sample (what shipping the function by value with every task would cost).
"""

from __future__ import annotations

import contextlib
import pickle
from typing import Any, Callable, Iterator

import cloudpickle

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row, timed


def main_noop(x: Any) -> Any:
    """A no-op defined in the benchmark script (``__main__`` when run with ``-m``)."""
    return x


@contextlib.contextmanager
def counting_put_bytes() -> Iterator[dict[str, int] | None]:
    """Sum the sizes of the blobs ``QueuePool`` sends with ``put_batch``, or yield ``None``
    if the package no longer has the ``encode_put`` hook."""
    import daskqueue.queue.pool as pool_module

    original = getattr(pool_module, "encode_put", None)
    if original is None:
        yield None
        return
    counter = {"bytes": 0, "blobs": 0}

    def encode_put(*a: Any, **kw: Any) -> bytes:
        blob = original(*a, **kw)
        counter["bytes"] += len(blob)
        counter["blobs"] += 1
        return blob

    pool_module.encode_put = encode_put
    try:
        yield counter
    finally:
        pool_module.encode_put = original


def enqueue(client: Any, func: Callable[[Any], Any], n: int, warmup: int) -> dict[str, Any]:
    """Time ``qp.batch_submit`` of ``n`` tasks ``(func, i)`` into a fresh pool, no consumers."""
    batch = [(func, i) for i in range(n)]  # built before the clock starts
    with daskqueue_pools(client, n_consumers=0) as (qp, _):
        if warmup:
            qp.batch_submit([(func, -i) for i in range(1, warmup + 1)])
        with counting_put_bytes() as counter:
            seconds, ids = timed(lambda: qp.batch_submit(batch))
        assert len(ids) == n and len(set(ids)) == n, "batch_submit returned wrong ids"
        put = sum(s.total_put for s in qp.stats())
        assert put == n + warmup, f"queues hold {put:,} messages, expected {n + warmup:,}"
    if counter is not None:
        nbytes, how = counter["bytes"], f"sum of {counter['blobs']} put blobs"
    else:  # estimate from a sample of the pickled arguments
        sample = range(0, n, max(1, n // 10_000))
        nbytes = round(sum(len(pickle.dumps((i,), pickle.HIGHEST_PROTOCOL)) for i in sample) / len(sample) * n)
        how = "estimated: len(pickle.dumps(args)) on a sample"
    return {"tasks": n, "seconds": seconds, "tasks_per_s": n / seconds, "bytes": nbytes,
            "mb_per_s": nbytes / seconds / 1e6, "bytes_how": how,
            "function": f"{func.__module__}.{func.__qualname__}"}


def pickle_loop(func: Callable[[Any], Any], n: int, dumps: Callable[..., bytes] = pickle.dumps) -> dict[str, Any]:
    """A plain local loop pickling ``(func, args)`` per task."""
    protocol = pickle.HIGHEST_PROTOCOL

    def loop() -> int:
        total = 0
        for i in range(n):
            total += len(dumps((func, (i,)), protocol))
        return total

    seconds, nbytes = timed(loop)
    return {"tasks": n, "seconds": seconds, "tasks_per_s": n / seconds, "bytes": nbytes,
            "mb_per_s": nbytes / seconds / 1e6}


def main() -> None:
    p = common.parser("submit", __doc__)
    p.add_argument("--tasks", type=positive, default=1_000_000, help="N tasks per variant")
    p.add_argument("--cloudpickle-sample", type=positive, default=20_000,
                   help="tasks in the per-task cloudpickle baseline sample")
    p.add_argument("--warmup", type=int, default=1000, help="untimed tasks submitted first")
    p.add_argument("--repeat", type=positive, default=3, help="runs of each variant (best kept)")
    args = p.parse_args()
    env = common.environment("submit")
    n = args.tasks
    if main_noop.__module__ != "__main__":
        log(f"note: main_noop's module is {main_noop.__module__!r}, not '__main__' "
            "(run with `python -m benchmarks.submit` to ship it by value)")
    details: dict[str, Any] = {}
    variants = [("module", tasks.noop), ("main", main_noop)]
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in variants}
    with local_cluster(args.workers, args.threads) as client:
        for r in range(args.repeat):  # alternate the order, so drift hits both alike
            for label, func in variants if r % 2 == 0 else variants[::-1]:
                log(f"batch_submit of {n:,} tasks, {label} function {func.__module__}.{func.__qualname__}")
                runs[label].append(enqueue(client, func, n, args.warmup))
                log(f"  {runs[label][-1]['tasks_per_s']:,.0f} tasks/s")
    for label, _ in variants:  # the best run of each: the least disturbed by the machine's noise
        best = max(runs[label], key=lambda x: x["tasks_per_s"])
        details[f"daskqueue_{label}"] = dict(best, all_tasks_per_s=[x["tasks_per_s"] for x in runs[label]])
    log(f"local pickle.dumps((func, args)) loops of {n:,}")
    details["pickle_module"] = pickle_loop(tasks.noop, n)
    details["pickle_main"] = pickle_loop(main_noop, n)
    k = min(n, args.cloudpickle_sample)
    details["cloudpickle_main_sample"] = pickle_loop(main_noop, k, cloudpickle.dumps)

    rows = []
    for label, name in [("module", "module func"), ("main", "__main__ func")]:
        dq, pk = details[f"daskqueue_{label}"], details[f"pickle_{label}"]
        rows.append(row(f"batch_submit, {name}", dq["tasks_per_s"], "tasks/s",
                        "local pickle.dumps loop", pk["tasks_per_s"]))
        rows.append(row(f"batch_submit, {name}", dq["mb_per_s"], "MB/s",
                        "local pickle.dumps loop", pk["mb_per_s"], note=dq["bytes_how"]))
        rows.append(row(f"bytes per task, {name}", dq["bytes"] / n, "B/task",
                        "per-task pickle", pk["bytes"] / n, better="lower"))
    cp = details["cloudpickle_main_sample"]
    rows.append(row("batch_submit, __main__ func", details["daskqueue_main"]["tasks_per_s"], "tasks/s",
                    f"per-task cloudpickle.dumps ({k:,} sample)", cp["tasks_per_s"]))
    common.report("submit", args, rows, details, env=env)


if __name__ == "__main__":
    main()
