"""The checks every map-like call makes before anything is pulled or put (``map``, ``imap``,
``imap_unordered``): its own options, then whether any consumer would run its tasks. The put
options themselves are the submission's (``Submitting._put_options``)."""

from __future__ import annotations

from typing import Any, Callable

from daskqueue.errors import NoConsumersError
from daskqueue.queue.submitting import check_key_function
from daskqueue.validate import check_choice, check_number

__all__ = ["check_map_call", "require_consumers"]


def check_map_call(*, errors: str, timeout_s: float | None, key: Callable[[Any], str] | None) -> None:
    """A map-like call's own options: ``errors`` is ``"raise"`` or ``"return"``,
    ``timeout_s`` None or above 0, ``key`` None or a callable item -> str."""
    check_choice("errors", errors, ("raise", "return"))
    check_number("timeout_s", timeout_s, above=0, none_ok=True)
    check_key_function(key)


def require_consumers(pool: Any, what: str) -> None:
    """Raise :class:`NoConsumersError` if no consumer pool of ``pool`` is started: nothing
    would run the tasks of ``what()`` (a call that waits for them would wait forever)."""
    if not pool.has_running_consumers():
        raise NoConsumersError(f"{what}() needs a started ConsumerPool on {pool!r}: create one "
                               "and call start() first")
