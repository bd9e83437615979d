"""The mixin that gives ``QueuePool`` its :meth:`~Executing.executor`, kept apart from
:mod:`daskqueue.executor` so that importing the pool does not import the executor (nor
cloudpickle and ``ast``, which it needs): only the first ``executor()`` call does."""

from __future__ import annotations

from typing import Any

__all__ = ["Executing"]


class Executing:
    """The mixin that gives ``QueuePool`` its :meth:`executor`."""

    def executor(self, **options: Any) -> Any:
        """A :class:`concurrent.futures.Executor` on this pool (see
        :class:`~daskqueue.executor.QueueExecutor` for the options). Use it as a context
        manager, or call ``shutdown()``: its thread ends then."""
        from daskqueue.executor import QueueExecutor

        return QueueExecutor(self, **options)
