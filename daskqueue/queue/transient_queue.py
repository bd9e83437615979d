"""daskqueue 0.2.0's module ``daskqueue.queue.transient_queue`` (deprecated: ``from daskqueue
import TransientQueue``). Its ``Full`` and ``Empty`` were the standard library's
``queue.Full`` and ``queue.Empty``; the queue actor's 0.2.0 methods are out of scope."""

import queue as _queue

from daskqueue.compat import old_names


def _transient():
    from daskqueue.queue.transient import TransientQueue

    return TransientQueue


__all__ = ["TransientQueue", "Full", "Empty"]
__getattr__ = old_names(__name__, {"TransientQueue": _transient, "Full": lambda: _queue.Full,
                                   "Empty": lambda: _queue.Empty},
                        "use `from daskqueue import TransientQueue` (queue.Full: `from queue import Full`)")
