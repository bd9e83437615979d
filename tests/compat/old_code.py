"""Task functions and consumers written as daskqueue 0.2.0 users wrote them (importable by
the workers). Warnings of the old names are silenced here: the tests check them elsewhere."""

import time
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from daskqueue.Consumer import ConsumerBaseClass


def add(x, y):
    return x + y


def func_no_return():
    return None


def sleep_func(t):
    time.sleep(t)
    return t


def takes_timeout(x, timeout=None):
    return (x, timeout)


def square_sum():
    return sum(i * i for i in range(1000))


class CopyWorker(ConsumerBaseClass):
    """0.2.0's examples/perf_copy.py consumer: unpacks each raw item."""

    def process_item(self, item):
        src, dst = item
        return f"{src}->{dst}"


class MessageReader(ConsumerBaseClass):
    """A 0.2.0 consumer that was also given submitted tasks: ``item.data()`` runs one."""

    def process_item(self, item):
        return item.data()


class NoProcessItem(ConsumerBaseClass):
    """0.2.0 refused this at creation: ``process_item`` is abstract."""
