"""daskqueue 0.2.0's module ``daskqueue.queue.base_queue`` (deprecated). ``Durability`` is
``QueuePool(durability="durable" | "transient")``; ``BaseQueue`` is the queue actors' base."""

from daskqueue.compat import old_names


def _durability():
    from daskqueue.compat.durability import Durability

    return Durability


def _base():
    from daskqueue.queue.base import QueueActorBase

    return QueueActorBase


__all__ = ["Durability", "BaseQueue"]
__getattr__ = old_names(__name__, {"Durability": _durability, "BaseQueue": _base},
                        'use QueuePool(durability="durable") or durability="transient" (daskqueue.Durability is '
                        "0.2.0's enum)")
