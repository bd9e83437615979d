"""A consumer's child process imports what its worker can: 0.2.0 ran tasks on the worker's
threads, so a task function of a module on a path the worker added at run time (pytest's
rootdir, a notebook's ``sys.path.append``) ran; it must also run in the child process of
``isolation="process"`` (found with 0.2.0's integration test, issue 22)."""

from __future__ import annotations

import sys

import pytest


def _add_path(path: str) -> None:
    sys.path.insert(0, path)


def _remove_path(path: str) -> None:
    while path in sys.path:
        sys.path.remove(path)


@pytest.mark.timeout(180)
def test_a_task_of_a_module_on_a_path_added_at_run_time_runs_in_the_child_process(client, pools, tmp_path):
    (tmp_path / "added_at_run_time_tasks.py").write_text("def triple(x):\n    return 3 * x\n")
    path = str(tmp_path)
    client.run(_add_path, path)
    _add_path(path)
    try:
        import added_at_run_time_tasks  # noqa: E402 - importable only now

        qp = pools.queue(1)
        cp = pools.consumer(qp, n_consumers=1, isolation="process")
        cp.start()
        assert qp.map(added_at_run_time_tasks.triple, range(5), timeout_s=120) == [0, 3, 6, 9, 12]
    finally:
        client.run(_remove_path, path)
        _remove_path(path)
        sys.modules.pop("added_at_run_time_tasks", None)
