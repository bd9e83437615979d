"""peers: daskqueue beside Ray, Parsl (HTEX) and Dask, one system after another, same machine.

Every system gets 2 worker processes x 1 thread (``--workers``): a ``LocalCluster`` of 2 x 1
for daskqueue and Dask, ``ray.init(num_cpus=2)`` for Ray, a ``HighThroughputExecutor`` with
``max_workers_per_node=2`` on a ``LocalProvider`` (one block) for Parsl. Three measures:

* ``per_task``: no-op tasks, one task per item. daskqueue ``qp.map(noop, range(N))`` (``--n``,
  default 1,000,000; ``map`` batches on its own); Ray ``f.remote(i)`` per item, Parsl one app
  per item and Dask ``client.map`` on ``--n-small`` items (default 20,000; these run at a few
  thousand tasks/s at best, so the rate is measured on fewer items and labelled so).
* ``lists``: what users of the per-task systems do instead: one task per list of
  ``--list-size`` (1,000) items, ``--n`` items in all; items/s. daskqueue does the same
  (``qp.map(noop, lists)``) for a like-for-like figure.
* ``latency``: one task at a time, submit -> result, ``--samples`` (300) with the SAME idle
  pause (``--gap-ms``, default 20) before every sample for every system: daskqueue
  ``cp.result(qp.submit(noop, i))``, Ray ``ray.get(f.remote(i))``, Parsl
  ``app(i).result()``, Dask ``client.submit(noop, i, pure=False).result()``.

``--rounds`` repeats everything, the systems' order rotated each round, so that the load of
a shared machine hits all of them alike; ratios daskqueue / peer are per round (same
window), and the table shows their median.

Ray and Parsl are an optional extra: ``pip install -e '.[peers]'``; a system whose package is
missing is skipped with a note. Ray is kept on the loopback interface (127.0.0.1).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any, Callable, Iterator

from benchmarks import common
from benchmarks.common import fmt, log, positive, summary

SYSTEMS = ("daskqueue", "ray", "parsl", "dask")

# Set before anything imports ray (``available`` does): Ray reads them at import. Measured:
# without the first, Ray's servers bind every interface and the node takes the machine's
# network address; with it, all of Ray listens on 127.0.0.1 (checked with ``ss -ltnp`` in
# every run: the ``listening`` figures of the JSON results).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def noop(x: Any) -> Any:
    """Return the argument (a module-level function: every system pickles it by reference)."""
    return x


def chunks(n: int, size: int) -> list[list[int]]:
    """``range(n)`` cut into lists of ``size`` items."""
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def check_lists(out: list[list[int]], n: int) -> None:
    """The lists came back whole and in order."""
    assert sum(len(x) for x in out) == n and out[0][0] == 0 and out[-1][-1] == n - 1, "wrong results"


def latency_loop(one: Callable[[int], Any], samples: int, gap_s: float, warmup: int) -> dict[str, float]:
    """p50/p99 (ms) of ``one(i)`` timed, with ``gap_s`` of idle sleep before every sample."""
    for i in range(warmup):
        one(-1 - i)
    times = []
    for i in range(samples):
        time.sleep(gap_s)
        t0 = time.perf_counter()
        one(i)
        times.append((time.perf_counter() - t0) * 1000)
    return summary(times)


def listening_sockets(pids: set[int]) -> list[str]:
    """The TCP listening addresses (``ss -ltnp``) of processes ``pids`` and their children."""
    try:
        import psutil

        every = set(pids)
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                every |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError, ImportError):
        return ["(ss not available)"]
    found = []
    for line in out.splitlines():
        if any(f"pid={p}," in line for p in every):
            found.append(line.split()[3])
    return sorted(set(found))


# -- the systems: each a context manager yielding {measure: callable} ---------------------------


@contextlib.contextmanager
def daskqueue_system(args: Any) -> Iterator[dict[str, Callable[[], dict]]]:
    from benchmarks.common import daskqueue_pools, local_cluster

    with local_cluster(args.workers, 1) as client:
        with daskqueue_pools(client, isolation=args.isolation) as (qp, cp):
            qp.map(noop, range(1000))

            def per_task() -> dict:
                t0 = time.perf_counter()
                out = qp.map(noop, range(args.n))
                s = time.perf_counter() - t0
                assert len(out) == args.n and out[-1] == args.n - 1
                return {"items": args.n, "seconds": s, "per_s": args.n / s, "how": f"qp.map, N={args.n:,}"}

            def lists() -> dict:
                data = chunks(args.n, args.list_size)
                t0 = time.perf_counter()
                out = qp.map(noop, data)
                s = time.perf_counter() - t0
                check_lists(out, args.n)
                return {"items": args.n, "seconds": s, "per_s": args.n / s,
                        "how": f"qp.map over {len(data):,} lists"}

            def latency() -> dict:
                return latency_loop(lambda i: cp.result(qp.submit(noop, i), timeout=60),
                                    args.samples, args.gap_ms / 1000, args.warmup)

            yield {"per_task": per_task, "lists": lists, "latency": latency,
                   "listening": lambda: listening_sockets({os.getpid()})}


@contextlib.contextmanager
def ray_system(args: Any) -> Iterator[dict[str, Callable[[], dict]]]:
    import ray

    ray.init(num_cpus=args.workers, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    try:
        f = ray.remote(num_cpus=1)(noop)
        ray.get([f.remote(i) for i in range(200)])  # start both worker processes

        def per_task() -> dict:
            n = args.n_small
            t0 = time.perf_counter()
            out = ray.get([f.remote(i) for i in range(n)])
            s = time.perf_counter() - t0
            assert out[-1] == n - 1
            return {"items": n, "seconds": s, "per_s": n / s, "how": f"f.remote per item, N={n:,}"}

        def lists() -> dict:
            data = chunks(args.n, args.list_size)
            t0 = time.perf_counter()
            out = ray.get([f.remote(x) for x in data])
            s = time.perf_counter() - t0
            check_lists(out, args.n)
            return {"items": args.n, "seconds": s, "per_s": args.n / s,
                    "how": f"f.remote per list, {len(data):,} lists"}

        def latency() -> dict:
            return latency_loop(lambda i: ray.get(f.remote(i)), args.samples, args.gap_ms / 1000, args.warmup)

        def listening() -> list[str]:
            import psutil

            pids = {p.pid for p in psutil.process_iter(["name", "cmdline"])
                    if any("ray" in c for c in (p.info["cmdline"] or [])[:3])}
            return listening_sockets(pids | {os.getpid()})

        yield {"per_task": per_task, "lists": lists, "latency": latency, "listening": listening}
    finally:
        ray.shutdown()


@contextlib.contextmanager
def parsl_system(args: Any) -> Iterator[dict[str, Callable[[], dict]]]:
    import parsl
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    run_dir = tempfile.mkdtemp(prefix="dq-peers-parsl-")
    config = Config(
        executors=[HighThroughputExecutor(
            label="htex", address="127.0.0.1", max_workers_per_node=args.workers, cores_per_worker=1,
            provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1),
        )],
        run_dir=run_dir, strategy="none", usage_tracking=0,
    )
    dfk = parsl.load(config)
    try:
        app = parsl.python_app(noop)
        [x.result() for x in [app(i) for i in range(200)]]

        def per_task() -> dict:
            n = args.n_small
            t0 = time.perf_counter()
            out = [x.result() for x in [app(i) for i in range(n)]]
            s = time.perf_counter() - t0
            assert out[-1] == n - 1
            return {"items": n, "seconds": s, "per_s": n / s, "how": f"one app per item, N={n:,}"}

        def lists() -> dict:
            data = chunks(args.n, args.list_size)
            t0 = time.perf_counter()
            out = [x.result() for x in [app(d) for d in data]]
            s = time.perf_counter() - t0
            check_lists(out, args.n)
            return {"items": args.n, "seconds": s, "per_s": args.n / s,
                    "how": f"one app per list, {len(data):,} lists"}

        def latency() -> dict:
            return latency_loop(lambda i: app(i).result(), args.samples, args.gap_ms / 1000, args.warmup)

        yield {"per_task": per_task, "lists": lists, "latency": latency,
               "listening": lambda: listening_sockets({os.getpid()})}
    finally:
        dfk.cleanup()
        parsl.clear()
        shutil.rmtree(run_dir, ignore_errors=True)


@contextlib.contextmanager
def dask_system(args: Any) -> Iterator[dict[str, Callable[[], dict]]]:
    from benchmarks.common import local_cluster

    with local_cluster(args.workers, 1) as client:
        client.gather(client.map(noop, range(-200, 0)))

        def per_task() -> dict:
            n = min(args.n_small, args.n_dask)
            t0 = time.perf_counter()
            out = client.gather(client.map(noop, range(n)))
            s = time.perf_counter() - t0
            assert out[-1] == n - 1
            return {"items": n, "seconds": s, "per_s": n / s, "how": f"client.map, N={n:,}"}

        def lists() -> dict:
            # Dask sends a list argument item by item (~40k items/s here): fewer lists
            n = min(args.n, args.n_dask * 40)
            data = chunks(n, args.list_size)
            t0 = time.perf_counter()
            out = client.gather(client.map(noop, data, pure=False))
            s = time.perf_counter() - t0
            check_lists(out, n)
            return {"items": n, "seconds": s, "per_s": n / s,
                    "how": f"client.map over {len(data):,} lists"}

        def latency() -> dict:
            return latency_loop(lambda i: client.submit(noop, i, pure=False).result(),
                                args.samples, args.gap_ms / 1000, args.warmup)

        yield {"per_task": per_task, "lists": lists, "latency": latency,
               "listening": lambda: listening_sockets({os.getpid()})}


FACTORIES = {"daskqueue": daskqueue_system, "ray": ray_system, "parsl": parsl_system, "dask": dask_system}


def available(system: str) -> str | None:
    """None if ``system`` can run here, else why not."""
    module = {"ray": "ray", "parsl": "parsl"}.get(system)
    if module is None:
        return None
    try:
        __import__(module)
    except ImportError:
        return f"{module} is not installed (pip install -e '.[peers]')"
    return None


def run_system(system: str, args: Any, measures: list[str]) -> dict:
    """Start ``system``, run ``measures`` on it, stop it; return their figures."""
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    with FACTORIES[system](args) as m:
        out["start_s"] = time.perf_counter() - t0
        out["listening"] = m["listening"]()
        for what in measures:
            log(f"  {system}: {what}")
            out[what] = m[what]()
            fig = out[what]
            log("    " + (f"p50 {fig['p50']:.2f} ms, p99 {fig['p99']:.2f} ms" if what == "latency"
                         else f"{fig['per_s']:,.0f}/s ({fig['how']})"))
    out["load_average"] = list(os.getloadavg())
    return out


def ratio_rows(rounds: list[dict[str, dict]], systems: list[str]) -> list[dict]:
    """Rows for ``common.report``: daskqueue beside each peer; value and baseline are medians over
    the rounds, the ratio is the median of the per-round ratios."""
    rows = []
    for what, key, unit, better in [("per_task", "per_s", "tasks/s", "higher"),
                                    ("lists", "per_s", "items/s", "higher"),
                                    ("latency", "p50", "ms", "lower"),
                                    ("latency", "p99", "ms", "lower")]:
        for peer in systems:
            if peer == "daskqueue":
                continue
            pairs = [(r["daskqueue"][what][key], r[peer][what][key]) for r in rounds
                     if what in r.get("daskqueue", {}) and what in r.get(peer, {})]
            if not pairs:
                continue
            dq = statistics.median(a for a, _ in pairs)
            pv = statistics.median(b for _, b in pairs)
            row = common.row(f"{what} {key}", dq, unit, peer, pv, better=better,
                             note=rounds[0][peer][what].get("how", "") if what != "latency" else "")
            row["ratio"] = statistics.median(a / b for a, b in pairs)
            rows.append(row)
    return rows


def wide_table(rounds: list[dict[str, dict]], systems: list[str]) -> str:
    """One line per measure, one column per system (every round's figure), then dq/peer."""
    header = ["measure"] + systems + [f"dq/{s}" for s in systems if s != "daskqueue"]
    lines = []
    for what, key, unit in [("per_task", "per_s", "/s"), ("lists", "per_s", "items/s"),
                            ("latency", "p50", "ms"), ("latency", "p99", "ms")]:
        cells = [f"{what} {key} ({unit})"]
        for s in systems:
            cells.append(" / ".join(fmt(r[s][what][key]) for r in rounds if what in r.get(s, {})) or "-")
        for s in systems:
            if s == "daskqueue":
                continue
            rs = [r["daskqueue"][what][key] / r[s][what][key] for r in rounds
                  if what in r.get("daskqueue", {}) and what in r.get(s, {})]
            cells.append(" / ".join(f"{x:.2f}x" for x in rs) or "-")
        lines.append(cells)
    return common.render_table(header, lines, markdown=True)


def main() -> None:
    p = common.parser("peers", __doc__)
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of " + ", ".join(SYSTEMS))
    p.add_argument("--measures", default="per_task,lists,latency", help="comma-separated")
    p.add_argument("--n", type=positive, default=1_000_000, help="items of daskqueue map and of every lists run")
    p.add_argument("--n-small", type=positive, default=20_000, help="items of the per-task runs of Ray and Parsl")
    p.add_argument("--n-dask", type=positive, default=5_000, help="items of Dask's per-task client.map (at most --n-small)")
    p.add_argument("--list-size", type=positive, default=1000, help="items per list in the lists runs")
    p.add_argument("--samples", type=positive, default=300, help="latency samples per system")
    p.add_argument("--warmup", type=int, default=20, help="untimed latency samples first")
    p.add_argument("--gap-ms", type=float, default=20.0, help="idle pause before every latency sample, every system")
    p.add_argument("--rounds", type=positive, default=1, help="rounds; the systems' order rotates each round")
    p.add_argument("--isolation", default="auto", help="daskqueue consumers' isolation")
    args = p.parse_args()
    if args.threads != 1:
        p.error("every system runs 1 thread per worker process")
    env = common.environment("peers")
    systems, skipped = [], {}
    for s in args.systems.split(","):
        why = available(s)
        if s not in FACTORIES:
            p.error(f"unknown system {s!r}")
        if why:
            skipped[s] = why
            log(f"skipping {s}: {why}")
        else:
            systems.append(s)
    measures = args.measures.split(",")
    rounds: list[dict[str, dict]] = []
    for k in range(args.rounds):
        # even rounds in the given order, odd ones reversed (so the first goes last), each
        # rotated one further every two rounds
        base = systems[::-1] if k % 2 else list(systems)
        r = (k // 2) % len(systems)
        order = base[r:] + base[:r]
        log(f"round {k + 1}/{args.rounds}: {', '.join(order)}")
        rounds.append({s: run_system(s, args, measures) for s in order})
    print()
    print(wide_table(rounds, systems))
    rows = ratio_rows(rounds, systems) if "daskqueue" in systems else []
    common.report("peers", args, rows, {"rounds": rounds, "skipped": skipped}, env=env)


if __name__ == "__main__":
    main()
