"""daskqueue 0.2.0's consumer classes: ``ConsumerBaseClass`` and ``DummyConsumer``.

A 0.2.0 consumer's ``process_item(self, item)`` received the item that ``put``/``put_many``
put (and, for a submitted task, a message whose ``.data()`` runs it). A subclass of
:class:`ConsumerBaseClass` still does: its ``process_item`` is wrapped, when the class is
made, to take the :class:`~daskqueue.messages.Message` that :class:`ConsumerBase` delivers and
pass on ``message.data`` for a raw item, the message itself for a task. As in 0.2.0,
``process_item`` is abstract: a subclass without one cannot be instantiated, and
``ConsumerPool`` refuses it at creation.
"""

from __future__ import annotations

import abc
import functools
import logging
from typing import Any

from daskqueue.compat import print_logs
from daskqueue.consumer.base import ConsumerBase
from daskqueue.messages import Message, Task

__all__ = ["ConsumerBaseClass", "DummyConsumer", "item_of"]

logger = logging.getLogger("daskqueue")


def item_of(message: Any) -> Any:
    """What a 0.2.0 ``process_item`` received for ``message``: the raw item itself, or the
    message of a task (whose ``.data()`` runs it). Anything that is not a message is passed
    on as it is (a direct call with an item)."""
    if isinstance(message, Message) and not isinstance(message.data, Task):
        return message.data
    return message


class ConsumerBaseClass(ConsumerBase, metaclass=abc.ABCMeta):
    """daskqueue 0.2.0's consumer base class: subclass it and implement
    ``process_item(self, item)``, which gets the raw item (see the module docstring).
    New code subclasses :class:`ConsumerBase`, whose ``process_item`` gets a ``Message``.

    As 0.2.0's workers did (importing daskqueue set up its logger), the worker of an old
    consumer prints daskqueue's log lines: ``logger.info`` in a ``process_item`` is seen."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        print_logs()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        user = cls.__dict__.get("process_item")
        if user is None or getattr(user, "takes_message", False) or getattr(user, "__isabstractmethod__", False):
            return

        @functools.wraps(user)
        def process_item(self: Any, message: Any) -> Any:
            return user(self, item_of(message))

        process_item.takes_message = True  # type: ignore[attr-defined]
        cls.process_item = process_item  # type: ignore[method-assign]

    @abc.abstractmethod
    def process_item(self, item: Any) -> Any:
        """Process one item (the raw item that was put); return its result."""


class DummyConsumer(ConsumerBaseClass):
    """0.2.0's ``DummyConsumer``: logs each item it gets."""

    def process_item(self, item: Any) -> None:
        logger.info("[%s %d]: Processing %s", type(self).__name__, self.index, item)
