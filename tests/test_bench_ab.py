"""The benchmark helpers that compare two trees: ``run_all --daskqueue`` measures another
checkout's package with this checkout's scripts, and the fail-over rows are medians."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import common
from benchmarks.failover import median_of
from benchmarks.run_all import package_shim


@pytest.mark.timeout(60)
def test_the_shim_imports_the_other_trees_package_and_these_scripts(tmp_path):
    tree = tmp_path / "other"
    (tree / "daskqueue").mkdir(parents=True)
    (tree / "daskqueue" / "__init__.py").write_text("WHERE = 'other'\n")
    shim = package_shim(str(tree))
    code = "import daskqueue, benchmarks.common as c; print(daskqueue.WHERE); print(c.ROOT)"
    env = {**os.environ, "PYTHONPATH": str(shim)}
    out = subprocess.run([sys.executable, "-c", code], cwd=shim, env=env, capture_output=True, text=True,
                         timeout=50, check=True).stdout.split()
    assert out == ["other", str(common.ROOT)]


@pytest.mark.timeout(10)
def test_the_shim_refuses_a_tree_without_the_package(tmp_path):
    with pytest.raises(SystemExit, match="no daskqueue package"):
        package_shim(str(tmp_path))


@pytest.mark.timeout(10)
def test_fail_over_rows_are_the_medians_of_the_samples():
    samples = [{"messages_on_queue": 5, "detection_s": d, "serving_s": s, "reopen_s": s - d}
               for d, s in [(0.05, 0.20), (0.03, 0.10), (0.90, 1.50)]]
    out = median_of(samples)
    assert (out["detection_s"], out["serving_s"], out["reopen_s"]) == pytest.approx((0.05, 0.20, 0.15))
    assert out["samples"] == samples and out["messages_on_queue"] == 5
