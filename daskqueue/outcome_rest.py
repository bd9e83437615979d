"""How long ``map`` sleeps after a round of outcome polls that brought nothing (many
outcomes still to come; a few are long-polled instead, see ``Outcomes._rest``).

Each round asks every queue, so a rest too short costs a round per queue for nothing and one
too long leaves outcomes waiting at the queues. Two cases:

* the next outcomes may end the map (as many are pending as the last round brought), or
  none arrived yet, or nothing is known of their pace: a short rest, doubling while rounds
  stay empty, up to a poll interval (``FIRST_REST_S``). A flat 50 ms made a 20,000-task
  durable map whose outcomes landed just after an empty round wait out the rest of it.
* otherwise outcomes come at a pace (the time between the last rounds that brought some,
  averaged): the first rest is half of it, the next ones a quarter, up to a poll interval,
  so the next arrival is seen at most a quarter of the pace late, in about three rounds.
  Restarting at 1 ms after every arrival made outcomes 10-100 ms apart cost 5-6 empty
  rounds each. Only while the rests since the last arrival add up to less than twice the
  pace (and ``STALLED_S``), though: past that the outcomes stopped coming at it (a stalled
  tail, a lost worker awaiting its lease's expiry), and the rest doubles up to a poll
  interval. Quarters of a fast pace kept a stalled map at 1 ms rests for good, each round
  asking every queue. ``STALLED_S`` keeps a sub-millisecond pace's gaps between bursts (a
  consumer's batch each, a few milliseconds apart) at its short rests (a safeguard: a 400,000
  no-op map measured the same with or without it).

Pure: the caller passes the time (monotonic seconds); no clock, no I/O.
"""

from __future__ import annotations

from daskqueue import defaults

__all__ = ["MapRest", "FIRST_REST_S", "STALLED_S"]

#: The first rest where the pace is unknown or the map may be ending, doubled while rounds
#: stay empty, up to ``defaults.POLL_INTERVAL_S``.
FIRST_REST_S = 0.001

#: Rests after an arrival that never count as a stall, whatever the pace: the gaps between
#: the bursts of a fast map (a consumer's batch each) are waited out at the pace's rests.
STALLED_S = 0.02


class MapRest:
    """The rests of one ``map``'s wait: :meth:`arrived` after a round that brought outcomes,
    :meth:`next` for the sleep after a round that brought none."""

    __slots__ = ("_rest", "_step", "_last_at", "_pace", "_rested")

    def __init__(self) -> None:
        self._rest = FIRST_REST_S  # the next rest
        self._step = 0.0  # 0: double it after each empty round; else: the next rests are this
        self._last_at: float | None = None  # when the last round that brought outcomes ended
        self._pace: float | None = None  # the mean time between such rounds
        self._rested = 0.0  # the rests given since the last arrival

    def arrived(self, now: float, count: int, pending: int) -> None:
        """A round ending at ``now`` brought ``count`` outcomes; ``pending`` are still to come."""
        if self._last_at is not None:
            gap = now - self._last_at
            self._pace = gap if self._pace is None else (self._pace + gap) / 2
        self._last_at = now
        self._rested = 0.0
        pace = self._pace
        if pace is None or pending <= count:
            self._rest, self._step = FIRST_REST_S, 0.0
            return
        cap = defaults.POLL_INTERVAL_S
        self._rest = max(FIRST_REST_S, min(cap, pace / 2))
        self._step = max(FIRST_REST_S, min(cap, pace / 4))

    def next(self) -> float:
        """The sleep after a round that brought nothing (and the one after it is planned)."""
        rest = self._rest
        self._rested += rest
        if self._step and self._pace is not None and self._rested < max(2 * self._pace, STALLED_S):
            self._rest = self._step  # still within the pace: the next arrival is due
        else:  # not paced, or overdue by a pace: doubling, up to a poll interval
            self._rest = min(defaults.POLL_INTERVAL_S, max(self._step, 2 * rest))
        return rest
