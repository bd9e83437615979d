"""churn: throughput while workers die, join and retire, against the same run without churn.

A durable pool of 2 queues on 3 workers (1 thread each) runs ``--tasks`` tasks of
``--task-ms`` each through ``qp.map``. Without churn, then with churn, alternated for
``--rounds`` rounds on fresh clusters: every ``--every-s`` seconds, in turn, a queue's worker
is killed with SIGKILL (its nanny starts a new worker: a join), a queue's worker is retired
(``client.retire_workers``: its queue is handed off) and a fresh worker added in its place
(``cluster.scale``), a worker without a queue is killed. Results are checked in order, and
that exactly one outcome came back per task.

Also, in the same run:

* fail-over: from SIGKILL of a durable queue's worker to that queue serving again
  (``benchmarks.failover``), Dask's own detection time reported apart;
* adaptive scale-up: on a 1-worker ``LocalCluster`` with ``adapt(minimum=1, maximum=3)``,
  seconds until the cluster has 3 workers after a backlog of ``--adapt-tasks`` 10-ms tasks is
  submitted to a daskqueue pool, against ``client.map`` of the same work on a fresh cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import statistics
import tempfile
import threading
import time
import warnings

from benchmarks import common, tasks
from benchmarks.common import log, positive, row


@contextlib.contextmanager
def cluster(n_workers: int):
    from distributed import Client, LocalCluster

    warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
    c = LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=None,
                     silence_logs=logging.ERROR)
    client = Client(c)
    try:
        client.wait_for_workers(n_workers, timeout=120)
        yield c, client
    finally:
        client.close()
        c.close()


def kill(client, address: str) -> None:
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)


def churner(c, client, qp, every_s: float, stop: threading.Event, events: list[str]) -> None:
    """Every ``every_s``, in turn: SIGKILL a queue's worker (its nanny starts a new worker,
    which joins), retire a queue's worker gracefully and add a fresh one in its place
    (``cluster.scale``), SIGKILL a worker without a queue. The cluster keeps its size, so
    the two runs compare like with like."""
    step = 0
    while not stop.wait(every_s):
        workers = sorted(client.scheduler_info()["workers"])
        queued = [q._address for q in qp.queues if q._address in workers]
        free = [w for w in workers if w not in queued]
        try:
            if step % 3 == 0 and queued:
                kill(client, queued[step // 3 % len(queued)])
                events.append("killed a queue's worker")
            elif step % 3 == 1 and queued:
                client.retire_workers([queued[0]])
                c.scale(len(c.worker_spec) + 1)
                events.append("retired a queue's worker, added one")
            elif step % 3 == 2 and free:
                kill(client, free[0])
                events.append("killed a worker without a queue")
        except Exception as e:  # a worker that left meanwhile
            events.append(f"{type(e).__name__}")
        step += 1


def run(n: int, task_s: float, churn_every_s: float | None) -> dict:
    from daskqueue import ConsumerPool, QueuePool

    with tempfile.TemporaryDirectory() as tmp, cluster(3) as (c, client):
        qp = QueuePool(client, 2, durability="durable", dirpath=os.path.join(tmp, "pool"))
        cp = ConsumerPool(client, qp)
        cp.start()
        qp.map(tasks.sleep_for, [0.0] * 100)  # warm up
        stop, events = threading.Event(), []
        thread = None
        if churn_every_s is not None:
            thread = threading.Thread(target=churner, args=(c, client, qp, churn_every_s, stop, events), daemon=True)
            thread.start()
        started = time.perf_counter()
        out = qp.map(tasks.sleep_timed, [task_s] * n, timeout_s=600)
        seconds = time.perf_counter() - started
        stop.set()
        if thread is not None:
            thread.join(timeout=60)
        assert len(out) == n and all(isinstance(x, float) for x in out), "map lost or misplaced results"
        outcomes = sum(qp._collector.settled)
        assert outcomes == n + 100, f"{outcomes} outcomes for {n + 100} tasks"
        cp.close()
        qp.close()
        workers_at_end = len(client.scheduler_info()["workers"])
    return {"tasks": n, "seconds": seconds, "tasks_per_s": n / seconds, "events": events,
            "outcomes": outcomes, "workers_at_end": workers_at_end}


def scale_up_s(use_queue: bool, n: int, task_s: float, limit_s: float) -> float:
    """Seconds from submitting the backlog until the adaptive cluster has 3 workers."""
    from daskqueue import ConsumerPool, QueuePool

    with cluster(1) as (c, client):
        c.adapt(minimum=1, maximum=3)
        time.sleep(2)  # let adapt settle at its minimum
        pools = None
        if use_queue:
            qp = QueuePool(client, 1)
            cp = ConsumerPool(client, qp)
            cp.start()
            pools = (qp, cp)
        started = time.perf_counter()
        if use_queue:
            pools[0].batch_submit([(tasks.sleep_for, task_s)] * n)
        else:
            futures = client.map(tasks.sleep_for, [task_s] * n, pure=False)
        while len(client.scheduler_info()["workers"]) < 3:
            if time.perf_counter() - started > limit_s:
                break
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        if use_queue:
            pools[1].join(timeout=120)
            pools[1].close()
            pools[0].close()
        else:
            client.gather(futures)
    return seconds


def main() -> None:
    p = common.parser("churn", __doc__)
    p.add_argument("--tasks", type=positive, default=40_000, help="tasks per run")
    p.add_argument("--task-ms", type=float, default=1.0, help="duration of each task")
    p.add_argument("--every-s", type=float, default=2.0, help="seconds between churn events")
    p.add_argument("--rounds", type=positive, default=2, help="alternated rounds of each")
    p.add_argument("--adapt-tasks", type=positive, default=3000, help="backlog for the scale-up test")
    p.add_argument("--messages", type=positive, default=100_000, help="ready messages for the fail-over")
    p.add_argument("--failovers", type=positive, default=3, help="fail-overs in turn (the row: their median)")
    args = p.parse_args()
    env = common.environment("churn")
    details: dict = {"steady": [], "churn": []}
    for r in range(args.rounds):
        for kind, every in (("steady", None), ("churn", args.every_s)):
            log(f"round {r + 1}: {kind}, {args.tasks:,} tasks of {args.task_ms} ms")
            details[kind].append(run(args.tasks, args.task_ms / 1000, every))
            d = details[kind][-1]
            log(f"  {d['tasks_per_s']:,.0f} tasks/s, {d['workers_at_end']} workers at the end, {d['events']}")
    steady = statistics.mean(d["tasks_per_s"] for d in details["steady"])
    churn = statistics.mean(d["tasks_per_s"] for d in details["churn"])

    from benchmarks.failover import fail_over, median_of, wait_for_size

    with tempfile.TemporaryDirectory() as tmp, cluster(3) as (_, client):
        log(f"fail-over: {args.messages:,} messages over 2 durable queues; SIGKILL of queue 1's worker")
        samples = []
        for i in range(args.failovers):  # one fail-over swings tens of ms: the row is a median
            samples.append(fail_over(client, args.messages, os.path.join(tmp, f"pool-{i}")))
            log(f"  {samples[-1]}")
            wait_for_size(client, 3)
        details["failover"] = median_of(samples)
    f = details["failover"]

    log(f"adaptive scale-up to 3 workers: {args.adapt_tasks:,} tasks of 10 ms")
    details["scale_up_daskqueue_s"] = scale_up_s(True, args.adapt_tasks, 0.01, 60)
    details["scale_up_client_map_s"] = scale_up_s(False, args.adapt_tasks, 0.01, 60)
    log(f"  daskqueue {details['scale_up_daskqueue_s']:.2f} s, client.map {details['scale_up_client_map_s']:.2f} s")

    rows = [
        row("throughput during churn (tasks/s)", churn, "tasks/s", "same run, no churn", steady,
            note="issue 11 target >= 0.70x"),
        row("SIGKILL -> durable queue serving (s), excluding detection", f["reopen_s"], "s",
            "Dask's detection of the death", f["detection_s"], better="lower",
            note=f"median of {args.failovers}; issue 11 target <= 5 s"),
        row("backlog -> 3 workers under adapt() (s)", details["scale_up_daskqueue_s"], "s",
            "client.map of the same work", details["scale_up_client_map_s"], better="lower"),
    ]
    common.report("churn", args, rows, details, env=env)


if __name__ == "__main__":
    main()
