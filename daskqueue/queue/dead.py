"""``DeadLetters``: a queue core's dead letters, numbered for clients' fetch cursors.

Every dead letter gets an *ordinal*, counting up over the queue's whole life (durable
reopens included: the shell restores the ordinals it persisted), never reused even when
letters are taken out: a client that has seen every ordinal below its cursor misses
nothing by asking for the ones from its cursor on. Pure, not thread-safe.
"""

from __future__ import annotations

import bisect
from typing import Any

from daskqueue.queue.records import Chunk, DeadLetter

__all__ = ["DeadLetters"]


class DeadLetters:
    """The dead letters in ordinal order, and the next ordinal (``appended``)."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []
        #: The next ordinal: every letter handed out so far has a lower one.
        self.appended = 0

    def add(self, chunk: Chunk, i: int, attempts: int, error: bytes, now: float, detach: Any = None) -> None:
        """Dead-letter message ``i`` of ``chunk``; ``detach(chunk, i)``, if given, is its
        payload alone (so the letter does not keep its whole put batch alive)."""
        seq = chunk.base_seq + i
        ordinal, self.appended = self.appended, self.appended + 1
        if detach is not None:
            chunk, i = Chunk(seq, 1, chunk.priority, detach(chunk, i), chunk.meta, True, chunk.type, chunk.key), 0
        self.letters.append(DeadLetter(seq, chunk, i, attempts, error, now, ordinal))

    def restore(self, seq: int, chunk: Chunk, attempts: int, error: bytes, at: float, ordinal: int | None) -> None:
        """Bring back a letter under its ``ordinal`` (None: the next one). Letters come back
        in ordinal order."""
        if ordinal is None:
            ordinal = self.appended
        if self.letters and ordinal <= self.letters[-1].ordinal:
            raise ValueError(f"dead letter ordinal {ordinal} restored after {self.letters[-1].ordinal}")
        self.letters.append(DeadLetter(seq, chunk, 0, attempts, error, at, ordinal))
        self.appended = max(self.appended, ordinal + 1)

    def advance(self, next_ordinal: int) -> None:
        """Never give a new letter an ordinal below ``next_ordinal``."""
        self.appended = max(self.appended, next_ordinal)

    def since(self, cursor: int) -> list[DeadLetter]:
        """The letters of ordinal ``>= cursor``, in order."""
        i = bisect.bisect_left(self.letters, cursor, key=lambda d: d.ordinal)
        return self.letters[i:]

    def take(self, seqs: set[int] | None) -> list[DeadLetter]:
        """Remove the letters with these seqs (all if None) and return them, in order."""
        if seqs is None:
            taken, self.letters = self.letters, []
        else:
            taken = [d for d in self.letters if d.seq in seqs]
            if taken:
                self.letters = [d for d in self.letters if d.seq not in seqs]
        return taken

    def validate(self) -> None:
        ordinals = [d.ordinal for d in self.letters]
        assert ordinals == sorted(set(ordinals)), "dead letters out of ordinal order"
        assert not ordinals or ordinals[-1] < self.appended, "a dead letter at or past the next ordinal"
