"""A task's failure as the exception the task raised, where it can be rebuilt here.

A worker sends a failure as text: the exception's qualified class name, its ``str()`` and its
formatted traceback (see :func:`daskqueue.messages.error_from_exception`), which the client
holds as a :class:`~daskqueue.errors.RemoteTaskError`. Code written against
``concurrent.futures`` or joblib expects ``future.result()`` to raise the task's own
exception type (``except ValueError:``), as Dask, loky and ``ProcessPoolExecutor`` do;
:func:`local_error` gives it that, with the ``RemoteTaskError`` (and so the remote traceback)
as its ``__cause__``.

The class is looked up only among modules this process has already imported: a name sent by
a worker never makes the client import a module. An exception is rebuilt only when calling its
class with one argument reproduces the worker's ``str()`` exactly, so no information is lost
or invented; otherwise the ``RemoteTaskError`` itself is the error.
"""

from __future__ import annotations

import ast
import sys
from typing import Any

from daskqueue.errors import RemoteTaskError

__all__ = ["local_error"]


def _class_named(qualified: str) -> type | None:
    """The exception class called ``qualified`` (``ValueError``, ``pkg.mod.Error``,
    ``pkg.mod.Outer.Error``) in an already imported module, else None."""
    # The longest imported module prefix, then attributes (a class may be nested).
    parts = qualified.split(".") if "." in qualified else ["builtins", qualified]
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        obj: Any = module
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
            if obj is None:
                return None
        return obj if isinstance(obj, type) else None
    return None


def _candidates(message: str) -> list[Any]:
    """The single arguments that may have given ``message`` as ``str(exc)``: the text
    itself, and for reprs such as ``KeyError``'s (``'x'``) the literal it spells."""
    out: list[Any] = [message]
    try:
        out.append(ast.literal_eval(message))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    return out


def rebuild(remote: RemoteTaskError) -> BaseException | None:
    """The task's exception, rebuilt here (see the module docstring), or None."""
    cls = _class_named(remote.exc_type)
    # Only ordinary errors: a rebuilt KeyboardInterrupt or SystemExit would stop the caller,
    # and a rebuilt OSError would lack its errno and filename (its str() has them: a caller
    # testing e.errno would see None).
    if cls is None or not issubclass(cls, Exception) or issubclass(cls, (RemoteTaskError, OSError)):
        return None
    for arg in _candidates(remote.exc_message):
        try:
            exc = cls(arg)
            if str(exc) == remote.exc_message:
                return exc
        except Exception:  # a class whose constructor wants other arguments
            continue
    return None


def local_error(remote: BaseException, *, original: bool = True) -> BaseException:
    """What ``Future.result()`` raises for a task's failure ``remote``.

    With ``original`` and a rebuildable :class:`RemoteTaskError`: the task's exception type
    with the same message, its ``__cause__`` the ``RemoteTaskError`` (whose text holds the
    remote traceback, printed above the local one), and attributes ``remote_traceback``,
    ``task_id`` and ``attempts``. Otherwise ``remote`` itself (a ``RemoteTaskError``, or a
    local error such as :class:`QueueLostError`).
    """
    if not original or not isinstance(remote, RemoteTaskError):
        return remote
    exc = rebuild(remote)
    if exc is None:
        return remote
    exc.__cause__ = remote
    try:
        exc.remote_traceback = remote.remote_traceback  # type: ignore[attr-defined]
        exc.task_id = remote.task_id  # type: ignore[attr-defined]
        exc.attempts = remote.attempts  # type: ignore[attr-defined]
    except AttributeError:  # a class with __slots__: the cause still carries them
        pass
    return exc
