"""Rebuilding a task's exception from the text a worker sent (no cluster)."""

from __future__ import annotations

import sys

import pytest

from daskqueue.errors import RemoteTaskError
from daskqueue.local_errors import local_error
from tests import executor_tasks  # noqa: F401  (TwoPartError's module must be imported to be found)


def remote(exc_type, message):
    return RemoteTaskError(3, exc_type, message, f"Traceback ...\n{exc_type}: {message}\n", 1)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("exc_type, message, cls", [
    ("ValueError", "boom", ValueError),
    ("KeyError", "'x'", KeyError),  # str(KeyError('x')) is its repr: rebuilt from the literal
    ("builtins.ZeroDivisionError", "division by zero", ZeroDivisionError),
    ("tests.executor_tasks.TwoPartError", "(7, 'detail')", RemoteTaskError),  # needs 2 arguments
    ("SystemExit", "1", RemoteTaskError),  # would stop the caller: never rebuilt
    ("FileNotFoundError", "[Errno 2] No such file or directory: 'x'", RemoteTaskError),  # errno lost
    ("OSError", "disk", RemoteTaskError),
    ("no_such_module_here.Error", "x", RemoteTaskError),
])
def test_a_failure_is_raised_as_its_own_type_only_when_that_loses_nothing(exc_type, message, cls):
    error = remote(exc_type, message)
    local = local_error(error)
    assert type(local) is cls and str(local) == (message if cls is not RemoteTaskError else str(error))
    if cls is not RemoteTaskError:
        assert local.__cause__ is error and local.remote_traceback == error.remote_traceback
    assert local_error(error, original=False) is error


@pytest.mark.timeout(10)
def test_a_class_name_sent_by_a_worker_never_imports_a_module():
    assert "wave" not in sys.modules or pytest.skip("wave already imported")
    assert isinstance(local_error(remote("wave.Error", "x")), RemoteTaskError)
    assert "wave" not in sys.modules
