"""Point 1 and 2 of issue 22: daskqueue 0.2.0's module paths and ``Durability`` import, warn
once per module at the importing line, and give today's objects."""

from __future__ import annotations

import queue
import subprocess
import sys
import warnings

import pytest

import daskqueue
from daskqueue import compat


def deprecations(record) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, DeprecationWarning)]


@pytest.mark.timeout(30)
def test_every_old_module_path_imports_and_warns_once_at_the_importing_line():
    compat.reset_warnings()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        from daskqueue.QueuePool import QueuePool
        from daskqueue.ConsumerPool import ConsumerPool
        from daskqueue.Consumer import ConsumerBaseClass, DummyConsumer, GeneralConsumer
        from daskqueue.Protocol import Message
        from daskqueue.queue.base_queue import Durability
        from daskqueue.queue.transient_queue import Full, TransientQueue
        from daskqueue.queue.durable_queue import DurableQueue
        from daskqueue.QueuePool import QueuePool as again  # the same module: no second warning
    assert issubclass(QueuePool, daskqueue.QueuePool) and issubclass(ConsumerPool, daskqueue.ConsumerPool)
    assert again is QueuePool
    assert GeneralConsumer is daskqueue.GeneralConsumer and Message is daskqueue.Message
    assert issubclass(ConsumerBaseClass, daskqueue.ConsumerBase) and issubclass(DummyConsumer, ConsumerBaseClass)
    assert Full is queue.Full  # 0.2.0's transient_queue imported the standard library's
    assert TransientQueue is daskqueue.TransientQueue and DurableQueue is daskqueue.DurableQueue
    assert Durability.DURABLE.value == "durable"
    warned = deprecations(record)
    modules = ["daskqueue.QueuePool", "daskqueue.ConsumerPool", "daskqueue.Consumer", "daskqueue.Protocol",
               "daskqueue.queue.base_queue", "daskqueue.queue.transient_queue", "daskqueue.queue.durable_queue"]
    for module in modules:
        assert len([w for w in warned if str(w.message).startswith(module + " is")]) == 1, module
    assert all(w.filename == __file__ for w in warned), [(w.filename, str(w.message)) for w in warned]


@pytest.mark.timeout(30)
def test_durability_is_importable_from_the_package_and_warns():
    compat.reset_warnings()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        from daskqueue import Durability
    assert {d.value for d in Durability} == {"durable", "transient"}
    [warning] = deprecations(record)
    assert 'durability="durable"' in str(warning.message) and warning.filename == __file__


SHADOWING = """
import daskqueue.QueuePool, daskqueue.ConsumerPool
from daskqueue.QueuePool import QueuePool as Old
from daskqueue import QueuePool, ConsumerPool
import daskqueue.queue.pool, daskqueue.consumer.pool
assert QueuePool is daskqueue.queue.pool.QueuePool, QueuePool
assert ConsumerPool is daskqueue.consumer.pool.ConsumerPool, ConsumerPool
assert issubclass(Old, QueuePool)
print("OK")
"""


@pytest.mark.timeout(60)
def test_importing_an_old_module_first_leaves_the_package_classes_in_place():
    """``daskqueue.QueuePool`` is both 0.2.0's module and today's class: importing the
    module in a fresh interpreter must not put it where the class is."""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", SHADOWING], capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr


@pytest.mark.timeout(30)
def test_the_benchmarks_unused_message_import_works():
    """Two 0.2.0 benchmarks import ``daskqueue.Protocol.Message`` without using it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from daskqueue.Protocol import Message  # noqa: F401


@pytest.mark.timeout(30)
def test_the_package_version_is_above_the_original_and_the_command_shows_it():
    from daskqueue import cli

    major, minor, _ = (int(x) for x in daskqueue.__version__.split("."))
    assert (major, minor) > (0, 2)
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0


@pytest.mark.timeout(60)
def test_the_version_has_one_source():
    """pyproject.toml reads the version from daskqueue/_version.py: no second copy."""
    import pathlib
    import tomllib

    root = pathlib.Path(daskqueue.__file__).parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"]["attr"] == "daskqueue._version.__version__"
