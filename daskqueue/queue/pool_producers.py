"""The producer side of ``QueuePool``: ``QueuePool.attach(client, name)``, pickling a pool as
a handle, and the :class:`~daskqueue.producers.ProducerSpec` a handle is rebuilt from.

A mixin of the facade (see :mod:`daskqueue.producers` for the design, and
:mod:`daskqueue.queue.attached` for the handles themselves). It uses the pool's public parts
(``client``, ``name``, ``config``, ``time_limit_s``, ``serving()``) and ``_check_open``.
"""

from __future__ import annotations

from typing import Any

from distributed import Client

from daskqueue import registry
from daskqueue.errors import ConfigurationError, QueueClosedError
from daskqueue.producers import ClassOrInstanceMethod, ProducerSpec
from daskqueue.validate import check_optional_str

__all__ = ["Producing"]


class Producing:
    """Handles of other producers on a pool (see the module docstring)."""

    client: Any
    name: str
    config: Any
    time_limit_s: float | None

    # -- other producers: attached clients, tasks (see daskqueue.producers) -----------------------

    #: Who this handle is: ``"owner"`` (it made the queues), ``"attached"`` (by name), ``"task"``.
    _role = "owner"
    #: The producer tag its puts carry and whose outcomes it reads (the owner's is 0).
    producer = 0

    def _attach_by_name(cls, client: Client, name: str) -> Any:  # type: ignore[misc]
        """``QueuePool.attach(client, name)``: a handle on the running pool registered as
        ``name`` on ``client``'s scheduler, from any process. It submits like the owner
        (``submit``, ``batch_submit``, ``put_many``, ``map``) and reads exactly the outcomes
        of what it submitted (``result(id)``, ``results()``, ``failures()``), none of another
        producer's. Closing it leaves the pool open; when the owner closes the pool, its calls
        raise :class:`PoolClosedError` (as does attaching to a name no open pool has)."""
        from daskqueue.queue.attached import attach_by_name

        if not isinstance(client, Client):
            raise ConfigurationError(f"client must be a distributed.Client, got {type(client).__name__}")
        return attach_by_name(client, check_optional_str("name", name) or "")

    def _attach_instance(self, client_or_consumer_pool: Any, name: str | None = None) -> Any:
        """On an instance: ``qp.attach(client, name)`` as on the class; the old internal
        ``qp.attach(consumer_pool)`` is :meth:`register_consumer_pool`."""
        if isinstance(client_or_consumer_pool, Client):
            return type(self).attach(client_or_consumer_pool, name)  # type: ignore[attr-defined]
        return self.register_consumer_pool(client_or_consumer_pool)  # type: ignore[attr-defined]

    attach = ClassOrInstanceMethod(_attach_by_name, _attach_instance)

    def producer_spec(self) -> ProducerSpec:
        """What a handle on this pool is rebuilt from elsewhere (what pickling it carries)."""
        serving = self.serving()  # type: ignore[attr-defined]
        # By index: a removed queue's index stays taken (a pool of queues 1 and 2 has 3 slots).
        refs: list[Any] = [None] * max(self.n_queues, 1 + max(serving, default=-1))  # type: ignore[attr-defined]
        for q, handle in serving.items():
            refs[q] = registry.actor_ref(handle)
        client = self.client
        address = client.scheduler.address if client is not None and client.scheduler is not None else None
        if address is None:
            address = getattr(getattr(self, "spec", None), "scheduler_address", None)
        return ProducerSpec(self.name, self.config, self.time_limit_s, tuple(refs), self.producer, address)

    def __reduce__(self) -> tuple[Any, ...]:
        """A pool pickles as a handle (``submit(f, queue_pool)``, a closure over it): see
        :func:`daskqueue.queue.attached.unpickle_pool`. Its puts carry this handle's producer
        tag, so the outcomes of what the task submits are read here."""
        from daskqueue.queue.attached import unpickle_pool

        # Only "closed": pickling blocks on nothing, so it is fine in an asynchronous
        # client's event loop (await client.submit(f, queue_pool)).
        if getattr(self, "_opening", None) is not None:
            raise ConfigurationError(f"{self!r} was made with an asynchronous client: await it first")
        if getattr(self, "_closed", False):
            raise QueueClosedError(f"{self!r} is closed")
        return (unpickle_pool, (self.producer_spec(),))
