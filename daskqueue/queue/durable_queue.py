"""daskqueue 0.2.0's module ``daskqueue.queue.durable_queue`` (deprecated: ``from daskqueue
import DurableQueue``). The queue actor's 0.2.0 methods (``put_sync``, ...) are out of scope."""

from daskqueue.compat import old_names


def _durable():
    from daskqueue.queue.durable import DurableQueue

    return DurableQueue


__all__ = ["DurableQueue"]
__getattr__ = old_names(__name__, {"DurableQueue": _durable}, "use `from daskqueue import DurableQueue`")
