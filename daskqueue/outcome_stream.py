"""The iterator that ``ConsumerPool.as_completed`` returns.

``as_completed`` yields a poll's outcomes at a time (``Outcomes.batches``, each batch a
``zip`` of ids and outcomes). A generator that re-yields them resumed a Python frame per
outcome, about as much client time as the claim's filing of that outcome at a million tasks;
an :class:`OutcomeStream` chains the batches in C (``itertools.chain.from_iterable``), so a
``for`` loop over it runs no Python code between polls.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator

__all__ = ["OutcomeStream"]


class OutcomeStream:
    """``(task_id, outcome)`` pairs of ``batches`` (a generator of iterables), one at a time.

    Iterated like the generator it replaces: ``for`` (which iterates the C chain itself),
    ``next()``, and :meth:`close`, which closes ``batches`` (its ``finally`` releases what
    it holds, e.g. an ``as_completed`` claim) as closing a generator did. Dropping the
    stream closes ``batches`` too, when it is collected. One reader at a time.
    """

    __slots__ = ("_batches", "_items")

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self._items = itertools.chain.from_iterable(batches)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self._items

    def __next__(self) -> tuple[int, Any]:
        return next(self._items)

    def close(self) -> None:
        """Stop: the wait ends and what it held is released (see the class docstring)."""
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()
