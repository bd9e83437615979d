"""Shared helpers of the benchmarks: clusters, pools, timing, tables and JSON results.

Every benchmark reports *rows*: a daskqueue figure beside a baseline measured in the same run,
and their ratio (the machine is small, shared and noisy; absolute figures drift, ratios less).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import logging
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"

# -- environment -------------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def environment(name: str) -> dict[str, Any]:
    """Versions, machine, git commit and the exact command line of this run."""
    import dask
    import distributed

    try:
        import daskqueue

        dq_version = getattr(daskqueue, "__version__", "unknown")
    except Exception as e:  # the package is being edited concurrently
        dq_version = f"import failed: {e}"
    status = _git("status", "--porcelain", "--", "daskqueue")
    return {
        "benchmark": name,
        "command": " ".join(shlex.quote(a) for a in ["python", "-m", f"benchmarks.{name}", *sys.argv[1:]]),
        "argv": list(sys.argv),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "daskqueue": dq_version,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        # daskqueue/ has uncommitted edits: the figures are of the working tree, not the commit
        "git_dirty": None if status is None else bool(status),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


# -- argument parsing --------------------------------------------------------------------------


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def parser(name: str, description: str | None) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares.

    Also turns SIGTERM into ``SystemExit`` so a killed benchmark (``timeout``, ``run_all``)
    still closes its clusters instead of orphaning worker processes.
    """
    signal.signal(signal.SIGTERM, _terminate)
    p = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{name}",
        description=(description or "").strip().splitlines()[0] if description else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--json", metavar="PATH", default=str(RESULTS_DIR / f"{name}.json"),
                   help="where to write the JSON results")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    p.add_argument("--threads", type=int, default=1, help="threads per worker")
    return p


def positive(value: str) -> int:
    """argparse type: an integer >= 1."""
    n = int(value.replace("_", "").replace(",", ""))
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return n


# -- clusters and pools ------------------------------------------------------------------------


@contextlib.contextmanager
def local_cluster(
    n_workers: int = 2, threads_per_worker: int = 1, config: dict[str, Any] | None = None
) -> Iterator[Any]:
    """A fresh ``LocalCluster`` and ``Client``; ``config`` is set before the cluster exists
    and stays set while it lives. Both are closed on exit, whatever happens."""
    import dask
    from distributed import Client, LocalCluster

    # dashboard_address=None still binds an HTTP port (8787, /health): quiet the clash warning
    warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
    with dask.config.set(config or {}):
        cluster = LocalCluster(
            n_workers=n_workers, threads_per_worker=threads_per_worker,
            dashboard_address=None, silence_logs=logging.ERROR,
        )
        try:
            client = Client(cluster)
            try:
                client.wait_for_workers(n_workers, timeout=120)
                yield client
            finally:
                client.close()
        finally:
            cluster.close()


@contextlib.contextmanager
def daskqueue_pools(
    client: Any, *, n_queues: int | None = None, n_consumers: int | None = None,
    start: bool = True, queue_options: dict[str, Any] | None = None, **consumer_options: Any,
) -> Iterator[tuple[Any, Any]]:
    """``(QueuePool, ConsumerPool)`` on ``client`` (one queue and one consumer per worker by
    default), closed on exit. ``n_consumers=0`` makes no consumers (``None`` in the tuple).
    ``queue_options`` go to ``QueuePool`` (``durability="durable", dirpath=...``)."""
    from daskqueue import ConsumerPool, QueuePool

    n_workers = len(client.scheduler_info(n_workers=-1)["workers"])
    qp = QueuePool(client, n_queues=n_queues or n_workers, **(queue_options or {}))
    cp = None
    try:
        if n_consumers != 0:
            cp = ConsumerPool(client, qp, n_consumers=n_consumers or n_workers, **consumer_options)
            if start:
                cp.start()
        yield qp, cp
    finally:
        try:
            if cp is not None:
                cp.close()
        finally:
            qp.close()


# -- timing and statistics ---------------------------------------------------------------------


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds`` (``time.perf_counter``)."""

    seconds: float = math.nan

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn()``; return ``(seconds, its value)``."""
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear interpolation between closest ranks."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values: list[float]) -> dict[str, float]:
    """n, mean, p50, p90, p99, min and max of ``values``."""
    return {
        "n": len(values),
        "mean": statistics.fmean(values) if values else math.nan,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "min": min(values, default=math.nan),
        "max": max(values, default=math.nan),
    }


# -- rows, tables, JSON ------------------------------------------------------------------------


def row(
    metric: str, value: float, unit: str, baseline_name: str, baseline: float, *,
    better: str = "higher", note: str = "",
) -> dict[str, Any]:
    """One reported figure: daskqueue's ``value`` beside a same-run ``baseline`` and
    ``ratio = value / baseline``. ``better`` says which direction of the value is good."""
    ratio = value / baseline if baseline and not math.isnan(baseline) and not math.isnan(value) else math.nan
    return {
        "metric": metric, "value": value, "unit": unit, "baseline_name": baseline_name,
        "baseline": baseline, "ratio": ratio, "better": better, "note": note,
    }


def fmt(x: Any) -> str:
    """A number for a table: thousands separators, about 3 significant digits."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    a = abs(x)
    if isinstance(x, int) or a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    if a == 0:
        return "0"
    return f"{x:.3g}"


def fmt_ratio(x: float) -> str:
    return "-" if x is None or math.isnan(x) else (f"{x:.3g}x" if abs(x) < 1000 else f"{x:,.0f}x")


TABLE_COLUMNS = ["metric", "daskqueue", "unit", "baseline", "baseline value", "ratio", "better"]


def table_cells(r: dict[str, Any]) -> list[str]:
    """The cells of one row, in ``TABLE_COLUMNS`` order."""
    return [r["metric"], fmt(r["value"]), r["unit"], r["baseline_name"], fmt(r["baseline"]),
            fmt_ratio(r["ratio"]), r["better"]]


def render_table(header: list[str], rows: list[list[str]], *, markdown: bool = False) -> str:
    """A plain-text (aligned) or markdown table."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    numeric = [i > 0 and all(_looks_numeric(r[i]) for r in rows) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _looks_numeric(s: str) -> bool:
    s = s.split(" ")[0].rstrip("x%")
    try:
        float(s.replace(",", ""))
        return True
    except ValueError:
        return s in ("-", "nan")


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def report(
    name: str, args: argparse.Namespace, rows: list[dict[str, Any]], details: dict[str, Any],
    *, env: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Print the rows as a table and write the JSON results to ``args.json``."""
    env = env or environment(name)
    print()
    print(f"## {name}  ({env['cpu_count']} CPUs, distributed {env['distributed']}, "
          f"daskqueue {env['daskqueue']} @ {env['git_commit']}{' +edits' if env['git_dirty'] else ''})")
    print(render_table(TABLE_COLUMNS, [table_cells(r) for r in rows]))
    doc = {**env, "options": vars(args), "rows": rows, "details": details}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_jsonable(doc), indent=2, default=str) + "\n")
    tmp.replace(path)
    print(f"\nresults written to {path}")
    return doc


def log(msg: str) -> None:
    """A progress line (flushed, so it shows under ``run_all``)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
