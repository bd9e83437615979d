"""daskqueue 0.2.0's module ``daskqueue.Protocol`` (deprecated: ``from daskqueue import
Message``). Today's ``Message`` is what a consumer receives; 0.2.0's ``Message(func, *args)``
constructor and methods are out of scope (submit tasks with ``QueuePool.submit``)."""

from daskqueue.compat import old_names


def _message():
    from daskqueue.messages import Message

    return Message


__all__ = ["Message"]
__getattr__ = old_names(__name__, {"Message": _message}, "use `from daskqueue import Message`")
