"""run_all: every benchmark in sequence (each in its own process), then one markdown table.

``--quick`` runs small sizes (a minute or two in all) and writes to ``results/quick/`` so
full-size results are not overwritten. The combined table goes to ``<results>/run_all.md``
and the combined JSON to ``<results>/run_all.json``.

``--daskqueue TREE`` runs these benchmark scripts against the ``daskqueue`` package of another
checkout (e.g. ``/work/wt/old``), results in ``<results>/tree-<name>/``: an old/new
comparison then differs only in the package, not in the scripts (the rows whose one sample
misled now take several and report the median: ``routing --repeat``, ``failover --repeat``,
``churn --failovers``, ``durable --put-repeat``). Alternate the trees run by run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common

BENCHMARKS = ["noop", "submit", "mixed", "latency", "memory", "idle", "direct", "durable", "failover", "churn",
              "fairness", "routing", "urgent", "burst"]
QUICK_ARGS = {
    "noop": ["--tasks", "50000", "--baseline-tasks", "2000"],
    "submit": ["--tasks", "100000"],
    "mixed": ["--tasks", "2000"],
    "latency": ["--n", "50"],
    "memory": ["--messages", "100000", "--dask-tasks", "5000"],
    "idle": ["--seconds", "3", "--grid", "1x4,4x8", "--probes", "10"],
    "failover": ["--messages", "20000"],
    "churn": ["--tasks", "5000", "--rounds", "1", "--adapt-tasks", "1000", "--messages", "20000"],
    "fairness": ["--bulk", "1000", "--interactive", "50", "--cap-tasks", "50", "--tput-tasks", "300",
                 "--rounds", "1"],
    "routing": ["--keys", "10000"],
    "urgent": ["--n", "30", "--long", "12", "--long-ms", "200", "--rounds", "1"],
    "burst": ["--tasks", "100000", "--lead-s", "4", "--rounds", "1"],
    "direct": ["--rounds", "2", "--n", "30", "--map-tasks", "50000"],
    "durable": ["--put-mib", "16", "--e2e-tasks", "20000", "--repeat", "1", "--reopen-messages", "200000",
                "--reopen-single", "10000"],
}


def package_shim(tree: str) -> Path:
    """A directory holding ``daskqueue`` (a link to ``tree``'s) and ``benchmarks`` (a link to
    this checkout's): run from it with it first on ``PYTHONPATH`` (worker processes inherit
    it), a benchmark imports this checkout's scripts and ``tree``'s package."""
    pkg = Path(tree).resolve() / "daskqueue"
    if not (pkg / "__init__.py").exists():
        raise SystemExit(f"--daskqueue {tree}: no daskqueue package there")
    shim = Path(tempfile.mkdtemp(prefix="run_all-shim-"))
    (shim / "daskqueue").symlink_to(pkg, target_is_directory=True)
    (shim / "benchmarks").symlink_to(common.ROOT / "benchmarks", target_is_directory=True)
    return shim


def run_one(name: str, extra: list[str], json_path: Path, timeout: float,
            shim: Path | None = None) -> dict[str, Any]:
    """Run ``python -m benchmarks.<name>`` (from ``shim`` if given, see ``package_shim``); on
    timeout SIGTERM it (it closes its clusters)."""
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *extra, "--json", str(json_path)]
    common.log("$ " + " ".join(cmd[1:]) + (f"  (daskqueue from {shim / 'daskqueue'})" if shim else ""))
    env = None
    if shim is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), *filter(None, [os.environ.get("PYTHONPATH")])])}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=shim or common.ROOT, env=env)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        rc = "timeout"
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        raise
    return {"name": name, "command": " ".join(["python", *cmd[1:]]), "returncode": rc,
            "seconds": time.perf_counter() - t0, "json": str(json_path)}


def main() -> None:
    p = common.parser("run_all", __doc__)
    p.set_defaults(json=None)
    p.add_argument("--quick", action="store_true", help="small sizes, results in results/quick/")
    p.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated benchmarks to run")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per benchmark")
    p.add_argument("--daskqueue", metavar="TREE", default=None,
                   help="measure the daskqueue package of this checkout with these scripts (e.g. /work/wt/old)")
    args = p.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        p.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    out_dir = common.RESULTS_DIR / "quick" if args.quick else common.RESULTS_DIR
    shim = package_shim(args.daskqueue) if args.daskqueue else None
    if shim is not None:
        out_dir = out_dir / f"tree-{Path(args.daskqueue).resolve().name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = common.environment("run_all")
    shared = ["--workers", str(args.workers), "--threads", str(args.threads)]
    runs = [run_one(n, (QUICK_ARGS[n] if args.quick else []) + shared, out_dir / f"{n}.json", args.timeout, shim)
            for n in names]

    table: list[list[str]] = []
    combined: dict[str, Any] = {**env, "options": vars(args), "runs": runs, "results": {}}
    for run in runs:
        path = Path(run["json"])
        if run["returncode"] != 0 or not path.exists():
            table.append([run["name"], f"FAILED ({run['returncode']})", "", "", "", "", "", ""])
            continue
        doc = json.loads(path.read_text())
        combined["results"][run["name"]] = {"command": doc["command"], "rows": doc["rows"]}
        for r in doc["rows"]:
            r = {k: (float("nan") if v is None and k in ("value", "baseline", "ratio") else v) for k, v in r.items()}
            table.append([run["name"], *common.table_cells(r)])
    header = ["benchmark", *common.TABLE_COLUMNS]
    md = common.render_table(header, table, markdown=True)
    title = (f"daskqueue benchmarks{' (quick)' if args.quick else ''}: {env['timestamp']}, "
             f"{env['cpu_count']} CPUs, python {env['python']}, distributed {env['distributed']}, "
             f"daskqueue {env['daskqueue']} @ {env['git_commit']}{' +edits' if env['git_dirty'] else ''}"
             + (f", package from {Path(args.daskqueue).resolve()}" if args.daskqueue else ""))
    print(f"\n# {title}\n\n{md}\n")
    (out_dir / "run_all.md").write_text(f"# {title}\n\n{md}\n")
    (out_dir / "run_all.json").write_text(json.dumps(common._jsonable(combined), indent=2, default=str) + "\n")
    print(f"combined results written to {out_dir / 'run_all.md'} and {out_dir / 'run_all.json'}")
    failed = [r["name"] for r in runs if r["returncode"] != 0]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
