"""The replies of one lane connection, written so that ``submit`` -> ``result`` wakes the
client once (:class:`Replies`, used by :mod:`daskqueue.queue.lane_server`).

``submit`` sends a put and, when its queue has no outcome poll in flight, a poll, in one
write (see :mod:`daskqueue.queue.lane`); then the client waits for the put's answer, and
``result`` for the poll's. Written as they come, the two answers cost the client two
wake-ups, and the queue's worker writes the put's answer (0.3-0.4 ms of its loop after an
idle gap, at a time when the task's run and settle wait on that loop) although the outcome
follows less than a millisecond later. So the put's answer of such a pair is *held*: it
goes out with the poll's answer in one write, or after :data:`PUT_HOLD_S` at the latest
(a long task: ``submit`` returns at most that much later than it would have). Only the
pair that arrived together is held: a put with no poll of its own (a ``submit`` loop, a
map's batches) is answered at once. Holding an answer changes nothing stored: a put is
stored before it is answered, and a connection lost meanwhile sends the put again through
Dask, with its token (the queue answers it without storing it twice).
"""

from __future__ import annotations

import asyncio
from typing import Callable

__all__ = ["PUT_HOLD_S", "Replies"]

#: The longest a put's answer waits for the outcome poll that came with it.
PUT_HOLD_S = 0.002


class Replies:
    """Which answers of one connection are held, and the writes (see the module docstring).

    ``write`` is the connection's ``transport.write`` (or a no-op once it is closed).
    Runs on the event loop's thread only.
    """

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self._pairs: dict[int, int] = {}  # put rid -> the rid of the poll that came with it
        self._polls: set[int] = set()  # polls of a pair, not answered yet
        self._held: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    def pair(self, put_rid: int, poll_rid: int) -> None:
        """The put ``put_rid`` and the poll ``poll_rid`` arrived in one read."""
        self._pairs[put_rid] = poll_rid
        self._polls.add(poll_rid)

    def send(self, rid: int, frame: bytes, *, may_hold: bool) -> None:
        """Write ``frame``, the answer of request ``rid`` (``may_hold``: a put's answer that
        succeeded), with any answer held before it; or hold it (see the module docstring)."""
        poll = self._pairs.pop(rid, None)
        self._polls.discard(rid)
        if may_hold and poll is not None and poll in self._polls:
            self._held.append(frame)
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(PUT_HOLD_S, self.flush)
            return
        if self._held:
            frame = b"".join(self._held) + frame
            self._held.clear()
            self._cancel()
        self._write(frame)

    def flush(self) -> None:
        """Write every answer held now (the hold ran out, or the connection closes)."""
        self._timer = None
        if self._held:
            frame = b"".join(self._held)
            self._held.clear()
            self._write(frame)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
