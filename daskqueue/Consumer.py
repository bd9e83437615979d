"""daskqueue 0.2.0's module ``daskqueue.Consumer`` (deprecated: ``from daskqueue import
ConsumerBase, GeneralConsumer``)."""

from daskqueue.compat import old_names


def _base():
    from daskqueue.compat.consumers import ConsumerBaseClass

    return ConsumerBaseClass


def _dummy():
    from daskqueue.compat.consumers import DummyConsumer

    return DummyConsumer


def _general():
    from daskqueue.consumer.general import GeneralConsumer

    return GeneralConsumer


__all__ = ["ConsumerBaseClass", "DummyConsumer", "GeneralConsumer"]
__getattr__ = old_names(__name__, {"ConsumerBaseClass": _base, "DummyConsumer": _dummy, "GeneralConsumer": _general},
                        "use `from daskqueue import ConsumerBase, GeneralConsumer` (a ConsumerBase subclass's "
                        "process_item gets a Message: message.data is the item)")
