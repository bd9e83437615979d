"""daskqueue 0.2.0's module ``daskqueue.QueuePool`` (deprecated: ``from daskqueue import
QueuePool``). ``QueuePoolActor`` was 0.2.0's internal pool actor: out of scope, it raises."""

from daskqueue.compat import old_names


def _queue_pool():
    from daskqueue.compat.old_classes import OldPathQueuePool

    return OldPathQueuePool


def _actor():
    from daskqueue.compat.queue_pool import QueuePoolActor

    return QueuePoolActor


def _durability():
    from daskqueue.compat.durability import Durability

    return Durability


def _consumers():
    from daskqueue.consumer.general import GeneralConsumer

    return GeneralConsumer


__all__ = ["QueuePool", "QueuePoolActor", "Durability", "GeneralConsumer"]
__getattr__ = old_names(__name__, {"QueuePool": _queue_pool, "QueuePoolActor": _actor, "Durability": _durability,
                                   "GeneralConsumer": _consumers},
                        "use `from daskqueue import QueuePool`")
