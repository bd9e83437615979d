"""How a settlement divides a lease: pure functions over its spans (no core state).

A consumer settles a lease with ``done`` (messages ``[0, done)`` ran, the rest were never
started) and ``errors`` (lease position -> error of a failed run, for positions ``< done``).
"""

from __future__ import annotations

from daskqueue.queue.records import Lease, Span

__all__ = ["check_settlement", "divide"]


def check_settlement(lease: Lease, done: int, errors: dict[int, bytes], fatal: frozenset[int] | set[int]) -> None:
    """Raise ``ValueError`` for positions outside ``lease`` (or fatal ones with no error)."""
    if not 0 <= done <= lease.count:
        raise ValueError(f"done={done} outside 0..{lease.count}")
    bad = [i for i in errors if not 0 <= i < done]
    if bad:
        raise ValueError(f"error positions {bad[:5]} outside the {done} messages that ran")
    stray = [i for i in fatal if i not in errors]
    if stray:
        raise ValueError(f"fatal positions {sorted(stray)[:5]} have no error")


def divide(spans: list[Span], done: int, errors: dict[int, bytes]) -> tuple[list[Span], list[tuple[Span, int]], list[Span]]:
    """Split a lease's ``spans`` into the acked spans, the failed messages (one-message
    spans, each with its lease position) and the released spans, each list in lease order.
    Attempts are those of the lease (the caller counts the failed run)."""
    acked: list[Span] = []
    failed: list[tuple[Span, int]] = []
    released: list[Span] = []
    pos = 0
    for span in spans:
        end = pos + span.count
        if end <= done:
            ran, rest = span, None
        elif pos >= done:
            ran, rest = None, span
        else:
            ran, rest = span.split(done - pos)
        if rest is not None:
            released.append(rest)
        if ran is not None:
            _divide_ran(ran, pos, errors, acked, failed)
        pos = end
    return acked, failed, released


def _divide_ran(span: Span, pos: int, errors: dict[int, bytes], acked: list[Span],
                failed: list[tuple[Span, int]]) -> None:
    """``span`` (at lease position ``pos``) ran: its failed messages one by one, the runs
    between them acked."""
    cursor = span.start
    for offset in sorted(p - pos for p in errors if pos <= p < pos + span.count) if errors else ():
        i = span.start + offset
        if i > cursor:
            acked.append(Span(span.chunk, cursor, i, span.attempts))
        failed.append((Span(span.chunk, i, i + 1, span.attempts), pos + offset))
        cursor = i + 1
    if cursor < span.stop:
        acked.append(Span(span.chunk, cursor, span.stop, span.attempts))
