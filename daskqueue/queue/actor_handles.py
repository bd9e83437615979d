"""The queue actor handle classes (subclasses of Dask's ``Actor``): see
:mod:`daskqueue.queue.handles`, which exports them and holds the functions around them.

Kept apart because they import Dask at import time: ``handles`` is imported by the consumer
modules, which a consumer's child process imports too, and that process needs no Dask.
"""

from __future__ import annotations

from typing import Any

from distributed.actor import Actor

__all__ = ["DirectActor", "WorkerActor"]


class DirectActor(Actor):
    """An ``Actor`` handle whose calls from a client go straight to the actor's worker.

    On a worker it behaves exactly like ``Actor`` (workers always call each other
    directly), and it pickles as a plain ``Actor``.
    """

    @property
    def _worker_rpc(self) -> Any:
        if self._worker is None and self._client is not None:
            return self._client.rpc(self._address)
        return super()._worker_rpc


class WorkerActor(Actor):
    """An ``Actor`` handle for use on a worker that holds no reference on the actor's key.

    A plain ``Actor`` made on a worker binds a worker client and a ``Future`` on the key,
    and one passed to ``client.submit`` is a dependency of the new task (an ``Actor`` is a
    ``TaskRef``): either keeps the scheduler from forgetting a queue actor that moved, and
    Dask then refuses to retire its worker. Consumers get :func:`queue_ref` tuples and make
    these from them.
    """

    def _try_bind_worker_client(self) -> None:
        if not self._worker:
            try:
                from distributed import get_worker

                self._worker = get_worker()
            except ValueError:
                self._worker = None

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (WorkerActor, (self._cls, self._address, self.key))
