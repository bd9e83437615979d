"""The package's public surface, and what importing it costs: the names that import Dask are
loaded on first use, so that a consumer's child process (which needs no Dask) starts fast."""

from __future__ import annotations

import subprocess
import sys

import cloudpickle
import pytest

import daskqueue

HEAVY = ("distributed", "dask", "numpy")


def _modules_after(code: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"],
        capture_output=True, timeout=100, text=True,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.timeout(120)
def test_importing_the_package_does_not_import_dask():
    assert not _modules_after("import daskqueue") & set(HEAVY)


@pytest.mark.timeout(120)
def test_a_consumer_twin_is_built_in_a_child_process_without_dask():
    # What the child does before it answers "ready" (consumer/child.py, main): import its
    # module, unpickle the consumer class (here by reference) and build the twin.
    from daskqueue.consumer.general import GeneralConsumer

    spec = cloudpickle.dumps((GeneralConsumer, (0, [None]), {"isolation": "thread"}))
    code = ("import pickle, daskqueue.consumer.child\n"
            f"cls, args, kwargs = pickle.loads({spec!r})\n"
            "cls(*args, **kwargs)")
    assert not _modules_after(code) & set(HEAVY)


@pytest.mark.timeout(60)
def test_every_public_name_resolves_and_star_import_binds_them_all():
    for name in daskqueue.__all__:
        assert getattr(daskqueue, name) is not None, name
    assert set(daskqueue.__all__) <= set(dir(daskqueue))
    namespace: dict = {}
    exec("from daskqueue import *", namespace)
    assert set(daskqueue.__all__) <= set(namespace)
    from daskqueue.queue.pool import QueuePool

    assert daskqueue.QueuePool is QueuePool  # the class, not 0.2.0's module of that name
    with pytest.raises(AttributeError):
        daskqueue.NoSuchName  # noqa: B018


@pytest.mark.timeout(60)
def test_the_handle_classes_keep_their_import_path():
    from daskqueue.queue.actor_handles import DirectActor, WorkerActor
    from daskqueue.queue.handles import DirectActor as direct, WorkerActor as worker

    assert (direct, worker) == (DirectActor, WorkerActor)
