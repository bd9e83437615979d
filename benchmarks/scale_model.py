"""scale_model: the figures the scale model in benchmarks/README.md is built from.

On a 2 x 1 ``LocalCluster`` (as every benchmark):

* ``put``: one client's put ceiling: ``put_many`` and ``batch_submit`` of ``--n`` items with no
  consumer, into 1 and 2 queues; the client's CPU per message (``time.process_time``: its
  main thread and its event loop) and the queues' workers' CPU per message.
* ``queue``: one queue actor's ceiling serving consumers that do nothing: ``get_batch`` +
  ``settle`` driven on the queue's own worker, in its process (no comm), for batches of
  1, 100 and 1,000 messages: the queue's own cost per call and per message; then the same
  calls from another process (the client) with batches of 1: what a remote consumer's call
  costs the queue's process besides.
* ``consumer``: a consumer's per-batch overhead: ``qp.map`` of no-ops with a fixed
  ``batch_size`` (1, 10, 100, 1,000): the time per batch, fitted as ``a + b * size``.

On a cluster of ``--big-workers`` (32) workers of 1 thread, all in ONE separate process
(processes=False style), with the scheduler in its own process so that its CPU is its own:

* ``control``: the scheduler's CPU and the messages it handles (RPC requests and stream
  messages, by operation) per second, idle without daskqueue, idle with a queue pool of
  ``--big-queues`` queues and a consumer on every worker, and under load (``qp.map`` of
  no-ops, then of 10 ms sleeps); plus the workers' process's CPU.

Run a part with ``--parts put,queue`` (default all).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive

# -- helpers run on workers and on the scheduler ---------------------------------------------


def process_cpu() -> float:
    """This process's CPU seconds (user + system)."""
    t = os.times()
    return t.user + t.system


async def drain_in_process(key: Any, batch: int, calls: int, dask_worker: Any = None) -> dict | None:
    """On the worker holding queue actor ``key``: ``calls`` rounds of ``get_batch(batch)`` +
    ``settle`` (all done, results None) awaited directly on the actor; None elsewhere."""
    from daskqueue.serialize import decode_delivery, encode_settle

    queue = dask_worker.state.actors.get(key)
    if queue is None:
        return None
    results = [pickle.dumps([None] * batch)]
    got = 0
    t0, c0 = time.perf_counter(), process_cpu()
    for _ in range(calls):
        blob = await queue.get_batch(batch, 0.0, "drainer")
        if blob is None:
            break
        lease_id, _, segments = decode_delivery(blob)
        n = sum(s.count for s in segments)
        if n != batch:
            results.append(pickle.dumps([None] * n))
        await queue.settle(lease_id, encode_settle(n, {}, set(), results[-1] if n != batch else results[0]))
        got += n
    return {"messages": got, "seconds": time.perf_counter() - t0, "cpu_s": process_cpu() - c0}


def count_scheduler_messages(dask_scheduler: Any = None) -> bool:
    """On the scheduler: count every RPC request and stream message by operation (wrapping
    its handler tables; idempotent)."""
    if getattr(dask_scheduler, "_dq_counts", None) is not None:
        return False
    counts: dict[str, int] = {}
    dask_scheduler._dq_counts = counts

    def counted(op: str, fn: Any) -> Any:
        # functools.wraps: the server passes ``comm`` to a handler whose signature has it
        if asyncio.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def wrapper(*a: Any, **k: Any) -> Any:
                counts[op] = counts.get(op, 0) + 1
                return await fn(*a, **k)
        else:
            @functools.wraps(fn)
            def wrapper(*a: Any, **k: Any) -> Any:  # type: ignore[misc]
                counts[op] = counts.get(op, 0) + 1
                return fn(*a, **k)
        return wrapper

    for table, prefix in [(dask_scheduler.handlers, "rpc:"), (dask_scheduler.stream_handlers, "stream:")]:
        for op, fn in list(table.items()):
            table[op] = counted(prefix + op, fn)
    return True


def scheduler_sample(dask_scheduler: Any = None) -> dict:
    """The scheduler's CPU seconds and message counts so far."""
    return {"cpu_s": process_cpu(), "counts": dict(dask_scheduler._dq_counts),
            "workers": len(dask_scheduler.workers), "time": time.time()}


# -- part: put ---------------------------------------------------------------------------------


def tree_cpu() -> float:
    """CPU seconds of this process and its live children (a consumer's child process)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def workers_cpu(client: Any) -> float:
    """CPU seconds of every worker process and their children: CPU, not wall time, is what
    this shared machine lets us measure fairly (wall time stretches with others' load)."""
    return sum(client.run(tree_cpu).values())


def part_put(client: Any, args: Any) -> dict:
    out: dict[str, Any] = {}
    n = args.n
    for n_queues in (1, 2):
        with daskqueue_pools(client, n_queues=n_queues, n_consumers=0) as (qp, _):
            qp.put_many(range(1000))
            for what, call in [("put_many", lambda: qp.put_many(range(n))),
                               ("batch_submit", lambda: qp.batch_submit([(tasks.noop, i) for i in range(n)]))]:
                w0, c0, t0 = workers_cpu(client), time.process_time(), time.perf_counter()
                call()
                s, c, w = time.perf_counter() - t0, time.process_time() - c0, workers_cpu(client) - w0
                fig = {"messages": n, "seconds": s, "per_s": n / s, "client_cpu_us": 1e6 * c / n,
                       "workers_cpu_us": 1e6 * w / n}
                out[f"{what}, {n_queues} queue(s)"] = fig
                log(f"  put: {what} into {n_queues} queue(s): {fig['per_s']:,.0f}/s, client CPU "
                    f"{fig['client_cpu_us']:.2f} us/msg, queues' workers {fig['workers_cpu_us']:.2f} us/msg")
    return out


# -- part: queue -------------------------------------------------------------------------------


def part_queue(client: Any, args: Any) -> dict:
    out: dict[str, Any] = {}
    with daskqueue_pools(client, n_queues=1, n_consumers=0) as (qp, _):
        handle = qp.queues[0]
        for batch, calls in [(1, 3000), (100, 2000), (1000, 600)]:
            qp.put_many(range(batch * calls))
            res = [r for r in client.run(drain_in_process, handle.key, batch, calls).values() if r]
            r = res[0]
            pairs = max(1, r["messages"] / batch)
            fig = {"batch": batch, **r, "per_s": r["messages"] / r["seconds"],
                   "cpu_per_s": r["messages"] / r["cpu_s"] if r["cpu_s"] else None,
                   "us_per_call_pair": 1e6 * r["seconds"] / pairs, "cpu_us_per_call_pair": 1e6 * r["cpu_s"] / pairs}
            out[f"in-process, batch {batch}"] = fig
            log(f"  queue in-process, batches of {batch}: {fig['per_s']:,.0f} messages/s wall, "
                f"{fig['cpu_us_per_call_pair']:.1f} us CPU ({fig['us_per_call_pair']:.1f} wall) per get_batch+settle")
        # The same from another process: what a remote consumer's two calls cost the queue.
        from daskqueue.serialize import decode_delivery, encode_settle

        calls = args.remote_calls
        qp.put_many(range(calls))
        results = pickle.dumps([None])
        # the workers' idle CPU (heartbeats, sweeper, the consumer-less pool), subtracted
        w0, t0 = workers_cpu(client), time.perf_counter()
        time.sleep(args.idle_s / 2)
        idle_per_s = (workers_cpu(client) - w0) / (time.perf_counter() - t0)
        w0, t0, c0 = workers_cpu(client), time.perf_counter(), time.process_time()
        for _ in range(calls):  # (the wall time includes the client's own share)
            blob = handle.get_batch(1, 0.0, "drainer").result()
            lease_id, _, _ = decode_delivery(blob)
            handle.settle(lease_id, encode_settle(1, {}, set(), results)).result()
        s, w, c = time.perf_counter() - t0, workers_cpu(client) - w0, time.process_time() - c0
        w -= idle_per_s * s
        fig = {"calls": 2 * calls, "seconds": s, "round_trips_per_s": 2 * calls / s,
               "workers_cpu_us_per_call": 1e6 * w / (2 * calls), "workers_idle_cpu_frac": idle_per_s,
               "client_cpu_us_per_call": 1e6 * c / (2 * calls)}
        out["remote, batch 1"] = fig
        log(f"  queue remote, batches of 1: {fig['round_trips_per_s']:,.0f} calls/s from the client, "
            f"{fig['workers_cpu_us_per_call']:.0f} us of the workers' CPU per call (idle "
            f"{100 * idle_per_s:.1f}% subtracted); the client's CPU {fig['client_cpu_us_per_call']:.0f} us per call")
    return out


# -- part: consumer ----------------------------------------------------------------------------


def part_consumer(client: Any, args: Any) -> dict:
    out: dict[str, Any] = {}
    points = []
    for batch in (1, 10, 100, 1000):
        n = min(args.n, batch * args.batches)
        with daskqueue_pools(client, batch_size=batch, isolation=args.isolation) as (qp, cp):
            qp.map(tasks.noop, range(min(n, 1000)))
            if batch == 1:  # the idle pools' CPU (heartbeats, idle long polls), subtracted
                w0, t0 = workers_cpu(client), time.perf_counter()
                time.sleep(args.idle_s / 2)
                idle_per_s = (workers_cpu(client) - w0) / (time.perf_counter() - t0)
                out["workers_idle_cpu_frac"] = idle_per_s
            # the workers' CPU (queue + consumer + its child) per batch: CPU, not wall time,
            # because others' load stretches wall time on this shared machine
            w0, c0, t0 = workers_cpu(client), time.process_time(), time.perf_counter()
            qp.map(tasks.noop, range(n))
            s = time.perf_counter() - t0
            w, c = workers_cpu(client) - w0 - idle_per_s * s, time.process_time() - c0
        n_batches = n / batch
        per_batch_ms = 1000 * w / n_batches
        points.append((batch, per_batch_ms))
        out[f"batch {batch}"] = {"tasks": n, "seconds": s, "per_s": n / s, "workers_cpu_ms_per_batch": per_batch_ms,
                                 "client_cpu_us_per_task": 1e6 * c / n}
        log(f"  consumer, batches of {batch}: {n / s:,.0f} tasks/s wall, workers' CPU {per_batch_ms:.3f} ms "
            f"per batch, client CPU {1e6 * c / n:.2f} us per task")
    # least squares of per_batch = a + b * size
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    out["fit"] = {"per_batch_ms": points[0][1] - b, "per_task_us": 1000 * b, "least_squares_a_ms": a}
    log(f"  consumer fit (workers' CPU): {out['fit']['per_batch_ms']:.3f} ms per batch (from batches of 1), "
        f"{out['fit']['per_task_us']:.2f} us per task")
    return out


# -- part: control -----------------------------------------------------------------------------

WORKERS_SCRIPT = """
import asyncio, sys
from distributed import Worker
async def main(address, n):
    workers = [Worker(address, nthreads=1, host="127.0.0.1", dashboard=False, memory_limit=0,
                      silence_logs=40) for _ in range(n)]
    await asyncio.gather(*workers)
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


@contextlib.contextmanager
def big_cluster(n_workers: int) -> Iterator[tuple[Any, int, int]]:
    """A scheduler process and one process of ``n_workers`` workers; yields
    ``(client, scheduler pid, workers pid)``."""
    from distributed import Client

    tmp = Path(tempfile.mkdtemp(prefix="dq-scale-"))
    sched_file = tmp / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(common.ROOT), os.environ.get("PYTHONPATH", "")] if p)}
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                              "--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = None
    try:
        deadline = time.time() + 60
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        address = json.loads(sched_file.read_text())["address"]
        workers = subprocess.Popen([sys.executable, "-c", WORKERS_SCRIPT, address, str(n_workers)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = Client(address)
        try:
            client.wait_for_workers(n_workers, timeout=180)
            yield client, sched.pid, workers.pid
        finally:
            client.close()
    finally:
        for proc in (workers, sched):
            if proc is not None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(20)
                if proc.poll() is None:
                    proc.kill()


def pid_cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def window(client: Any, workers_pid: int, seconds: float | None = None, during: Any = None) -> dict:
    """Scheduler CPU and message rates over ``seconds`` of idle, or while ``during()`` runs."""
    s0, w0, t0 = client.run_on_scheduler(scheduler_sample), pid_cpu(workers_pid), time.perf_counter()
    if during is not None:
        during()
    else:
        time.sleep(seconds or 0)
    s1, w1 = client.run_on_scheduler(scheduler_sample), pid_cpu(workers_pid)
    dt = time.perf_counter() - t0
    per_s = {op: (c - s0["counts"].get(op, 0)) / dt for op, c in s1["counts"].items()
             if c - s0["counts"].get(op, 0) > 0}
    return {"seconds": dt, "scheduler_cpu_frac": (s1["cpu_s"] - s0["cpu_s"]) / dt,
            "workers_process_cpu_frac": (w1 - w0) / dt, "messages_per_s": sum(per_s.values()),
            "by_op_per_s": dict(sorted(per_s.items(), key=lambda kv: -kv[1])), "workers": s1["workers"]}


def part_control(args: Any) -> dict:
    out: dict[str, Any] = {}
    n = args.big_workers
    with big_cluster(n) as (client, sched_pid, workers_pid):
        client.run_on_scheduler(count_scheduler_messages)
        log(f"  control: {n} workers up")
        out["idle, no daskqueue"] = window(client, workers_pid, args.idle_s)
        log(f"  idle, no daskqueue: {_brief(out['idle, no daskqueue'])}")
        from daskqueue import ConsumerPool, QueuePool

        pools: list[Any] = []

        def start() -> None:
            pools.append(QueuePool(client, n_queues=args.big_queues))
            pools.append(ConsumerPool(client, pools[0], isolation="thread"))
            pools[1].start()

        out["starting the pools"] = window(client, workers_pid, during=start)
        log(f"  starting {args.big_queues} queues + {n} consumers: {_brief(out['starting the pools'])}")
        qp, cp = pools
        try:
            time.sleep(2)
            out["idle, with pools"] = window(client, workers_pid, args.idle_s)
            log(f"  idle, {args.big_queues} queues + {n} consumers: {_brief(out['idle, with pools'])}")
            m = args.big_map
            w = window(client, workers_pid, during=lambda: qp.map(tasks.noop, range(m)))
            w["tasks_per_s"] = m / w["seconds"]
            out["load, map of no-ops"] = w
            log(f"  map of {m:,} no-ops ({w['tasks_per_s']:,.0f}/s): {_brief(w)}")
            k = args.big_sleeps
            w = window(client, workers_pid, during=lambda: qp.map(tasks.sleep_for, [0.01] * k))
            w["tasks_per_s"] = k / w["seconds"]
            out["load, map of 10 ms sleeps"] = w
            log(f"  map of {k:,} 10 ms sleeps ({w['tasks_per_s']:,.0f}/s): {_brief(w)}")
        finally:
            cp.close()
            qp.close()
    return out


def _brief(w: dict) -> str:
    top = ", ".join(f"{op} {r:.1f}" for op, r in list(w["by_op_per_s"].items())[:5])
    return (f"scheduler CPU {100 * w['scheduler_cpu_frac']:.1f}%, workers' process "
            f"{100 * w['workers_process_cpu_frac']:.0f}%, {w['messages_per_s']:.1f} msgs/s ({top})")


def main() -> None:
    p = common.parser("scale_model", __doc__)
    p.add_argument("--parts", default="put,queue,consumer,control")
    p.add_argument("--n", type=positive, default=500_000, help="messages per put run; cap of consumer runs")
    p.add_argument("--remote-calls", type=positive, default=500, help="get_batch+settle pairs from the client")
    p.add_argument("--batches", type=positive, default=2000, help="batches per consumer-overhead run")
    p.add_argument("--isolation", default="auto")
    p.add_argument("--big-workers", type=positive, default=32)
    p.add_argument("--big-queues", type=positive, default=4)
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--big-map", type=positive, default=200_000)
    p.add_argument("--big-sleeps", type=positive, default=3200)
    args = p.parse_args()
    env = common.environment("scale_model")
    parts = args.parts.split(",")
    details: dict[str, Any] = {}
    if {"put", "queue", "consumer"} & set(parts):
        with local_cluster(args.workers, args.threads) as client:
            for name, fn in [("put", part_put), ("queue", part_queue), ("consumer", part_consumer)]:
                if name in parts:
                    log(f"part {name}")
                    details[name] = fn(client, args)
    if "control" in parts:
        log(f"part control ({args.big_workers} workers in one process, scheduler in its own)")
        details["control"] = part_control(args)
    rows = []
    if "put" in details:
        d = details["put"]
        rows.append(common.row("put_many, 1 queue", d["put_many, 1 queue(s)"]["per_s"], "msgs/s",
                               "batch_submit, 1 queue", d["batch_submit, 1 queue(s)"]["per_s"]))
    if "queue" in details:
        d = details["queue"]
        rows.append(common.row("queue in-process, batches of 1,000", d["in-process, batch 1000"]["per_s"],
                               "msgs/s", "batches of 1", d["in-process, batch 1"]["per_s"]))
    if "control" in details:
        d = details["control"]
        rows.append(common.row("scheduler CPU, idle with pools", d["idle, with pools"]["scheduler_cpu_frac"],
                               "fraction", "idle without", d["idle, no daskqueue"]["scheduler_cpu_frac"],
                               better="lower"))
    common.report("scale_model", args, rows, details, env=env)


if __name__ == "__main__":
    main()
