"""daskqueue 0.2.0's module ``daskqueue.ConsumerPool`` (deprecated: ``from daskqueue import
ConsumerPool``)."""

from daskqueue.compat import old_names


def _consumer_pool():
    from daskqueue.compat.old_classes import OldPathConsumerPool

    return OldPathConsumerPool


__all__ = ["ConsumerPool"]
__getattr__ = old_names(__name__, {"ConsumerPool": _consumer_pool}, "use `from daskqueue import ConsumerPool`")
