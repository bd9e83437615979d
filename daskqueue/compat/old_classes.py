"""The pools as 0.2.0's module paths give them (``from daskqueue.QueuePool import
QueuePool``): subclasses marked :attr:`old_spellings`, so that their ``results()`` nest by
consumer as 0.2.0's did. Otherwise they are today's pools."""

from __future__ import annotations

from daskqueue.consumer.pool import ConsumerPool
from daskqueue.queue.pool import QueuePool

__all__ = ["OldPathQueuePool", "OldPathConsumerPool"]


class OldPathQueuePool(QueuePool):
    """``daskqueue.QueuePool.QueuePool``: a :class:`QueuePool` made with 0.2.0's spellings."""

    old_spellings = True


class OldPathConsumerPool(ConsumerPool):
    """``daskqueue.ConsumerPool.ConsumerPool``: a :class:`ConsumerPool` made with 0.2.0's
    spellings."""

    old_spellings = True
