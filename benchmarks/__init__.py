"""Benchmarks of daskqueue, each beside a baseline measured in the same run.

Run one with ``python -m benchmarks.<name> --help`` from the repository root, or all of them
with ``python -m benchmarks.run_all [--quick]``. Results go to ``benchmarks/results/``.
"""
