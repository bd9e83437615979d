"""joblib's ``backend="daskqueue"``: ``Parallel`` (and scikit-learn's ``n_jobs``) on a queue pool."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

joblib = pytest.importorskip("joblib")

from joblib import Parallel, delayed  # noqa: E402

import daskqueue  # noqa: E402,F401  (registers the backend)
from daskqueue import NoConsumersError, RemoteTaskError  # noqa: E402
from tests import executor_tasks as tasks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def running(pools):
    """A queue pool with its consumers started, no retries (see tests/test_executor.py)."""
    qp = pools.queue(2, max_retries=0)
    pools.consumer(qp).start()
    return qp


@pytest.mark.timeout(60)
def test_parallel_runs_on_the_pool_in_order(running):
    with joblib.parallel_config(backend="daskqueue", queue_pool=running):
        squares = Parallel(n_jobs=-1)(delayed(tasks.fail_on)(x, -1) for x in range(500))
        pids = set(Parallel(n_jobs=-1)(delayed(tasks.pid)(i) for i in range(20)))
    assert squares == [x * x for x in range(500)]
    assert os.getpid() not in pids  # ran on the workers, not here
    # A batch travels as the argument of a task, never as its function (the client's
    # function cache would keep the batches, and their data, alive).
    from daskqueue import function_pickle

    cached = list(function_pickle._by_reference_cache._entries)
    assert not [f for f in cached if type(getattr(f, "fn", None)).__name__ == "BatchedCalls"]


@pytest.mark.timeout(60)
def test_parallel_raises_the_calls_own_error_with_the_remote_traceback(running):
    with joblib.parallel_config(backend="daskqueue", queue_pool=running):
        with pytest.raises(ValueError, match="bad item 7") as info:
            Parallel(n_jobs=2)(delayed(tasks.fail_on)(x, 7) for x in range(40))
        # The backend stays usable after an abort.
        assert Parallel(n_jobs=2)(delayed(tasks.inc)(x) for x in range(5)) == [1, 2, 3, 4, 5]
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTaskError) and "in fail_on" in cause.remote_traceback


@pytest.mark.timeout(60)
def test_parallel_without_started_consumers_refuses_at_once_unless_n_jobs_is_1(pools):
    qp = pools.queue(1)
    with joblib.parallel_config(backend="daskqueue", queue_pool=qp):
        with pytest.raises(NoConsumersError):
            Parallel(n_jobs=-1)(delayed(tasks.inc)(x) for x in range(3))
        # n_jobs=1 runs in this process, as with every backend: no consumer needed.
        assert Parallel(n_jobs=1)(delayed(tasks.inc)(x) for x in range(3)) == [1, 2, 3]


@pytest.mark.timeout(90)
def test_scikit_learn_cross_val_score_runs_through_the_backend(running):
    sklearn = pytest.importorskip("sklearn")  # noqa: F841
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    X, y = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=500)
    here = cross_val_score(model, X, y, cv=5, n_jobs=1)
    # A cold worker imports scikit-learn first (several seconds on a loaded machine).
    with joblib.parallel_config(backend="daskqueue", queue_pool=running):
        there = cross_val_score(model, X, y, cv=5, n_jobs=2)
    assert list(there) == list(here)


@pytest.mark.timeout(60)
def test_importing_daskqueue_does_not_import_joblib_and_the_backend_comes_with_it():
    code = ("import sys, daskqueue, daskqueue.queue.pool; assert 'joblib' not in sys.modules, 'joblib imported'; "
            "assert 'daskqueue.executor' not in sys.modules, 'executor imported'; "
            "import joblib, joblib.parallel as p; assert 'daskqueue' in p.BACKENDS; "
            "assert joblib.__loader__.__class__.__name__ == 'SourceFileLoader'; print('ok')")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=50)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.timeout(60)
def test_the_backend_is_registered_after_find_spec_and_with_two_hook_finders():
    # importlib.util.find_spec("joblib") asks the finders for a spec it never loads; the
    # import after it must still register. A reloaded hook module (a second finder) must
    # neither recurse nor register twice.
    code = ("import importlib, importlib.util, sys, daskqueue, daskqueue.joblib_hook as h; "
            "assert importlib.util.find_spec('joblib') is not None; assert 'joblib' not in sys.modules; "
            "importlib.reload(h); h.register_when_imported(); sys.meta_path.insert(0, h._JoblibFinder()); "
            "import joblib, joblib.parallel as p; assert 'daskqueue' in p.BACKENDS, 'not registered'; "
            "assert joblib.__loader__.__class__.__name__ == 'SourceFileLoader'; print('ok')")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=50)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
