"""Reading every outcome of a queue that is being removed (a mixin of
:class:`~daskqueue.results.ResultCollector`, which owns the state; the fetches are
:mod:`daskqueue.outcome_polls`'s)."""

from __future__ import annotations

import logging
from typing import Any, Callable

from daskqueue import defaults
from daskqueue.errors import QueueMovedError
from daskqueue.outcome_polls import _Fetch

__all__ = ["DrainMixin"]

logger = logging.getLogger("daskqueue")


class DrainMixin:
    """``fetch_all`` of the result collector."""

    # Owned by ResultCollector (and its PollsMixin).
    _lock: Any
    _cursors: list[int]
    _dead_cursors: list[int]
    _call: Callable[..., Any]
    _answer: Callable[[int, Any, float | None], Any]
    _send: Callable[[int, float], _Fetch]
    _apply: Callable[[_Fetch, Any], int]

    def fetch_all(self, q: int, deadline: float | None = None, *, closed: bool = False) -> int:
        """Fetch queue ``q``'s outcomes until an answer shows it holds none beyond the cursors
        it was sent with; the outcomes filed (or held). For a queue being removed
        (``remove_queue``): one plain poll is not enough, since its answer is dropped when an
        older poll's answer, applied first, moved the cursors (see the module docstring of
        :mod:`daskqueue.outcome_polls`), and the queue would then close with outcomes nobody
        fetched. ``closed``: the queue is closed (``close_if_drained``) but its actor not
        released yet: it is read with the calls a closed queue still answers, and nothing
        new arrives there any more, so this reads its last outcomes for good. Each answer
        is waited for until ``deadline`` (default: the table's own). A queue that moved away
        from the actor a round went to (handed off, or reopened elsewhere) is asked that
        round again where it is now, up to ``PUT_ATTEMPTS`` times in all: it only reads."""
        n = 0
        moves = 0
        for rounds in range(1, 1_000):  # each round moves the cursors on (or ends): bounded in practice
            try:
                fetch, answer = self._fetch_round(q, deadline, closed)
            except QueueMovedError as e:
                moves += 1
                if moves >= defaults.PUT_ATTEMPTS:
                    raise
                logger.info("queue %d moved while its outcomes were read (%s); reading them there", q,
                            type(e).__name__)
                continue
            n += self._apply(fetch, answer)
            if (answer[0], answer[2]) == fetch.cursors:
                logger.debug("queue %d: every outcome fetched (%d, in %d rounds)", q, n, rounds)
                return n
        raise AssertionError(f"queue {q}: its outcomes kept coming")

    def _fetch_round(self, q: int, deadline: float | None, closed: bool) -> tuple[_Fetch, Any]:
        """One round of :meth:`fetch_all`: a fetch sent with the cursors as they are, and its
        answer (not applied yet)."""
        # Sent outside the collector's lock (as polls are): a call waits for a moving queue.
        if closed:
            with self._lock:
                cursors = (self._cursors[q], self._dead_cursors[q])
            fetch = _Fetch(q, (self._call(q, "fetch_results", cursors[0]),
                               self._call(q, "fetch_dead", cursors[1])), cursors)
        else:
            fetch = self._send(q, 0.0)
        if closed:
            results, dead = (self._answer(q, pending, deadline) for pending in fetch.pending)
            return fetch, (*results, *dead)
        return fetch, self._answer(q, fetch.pending, deadline)
