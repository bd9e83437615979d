"""Where a queue pool's new messages go: the pure routing state of the client.

Pure: no Dask, no clock, no I/O. A :class:`Router` knows the queues new messages go to (the
*targets*: every queue of the pool but those removed or being drained), the round-robin
position, the key ring (``key=`` / ``keys=``: each key to one queue) and, in a fair or capped
pool, the type ring (every message of a type to one queue, so that its caps hold pool-wide).
The functions below split a call's messages into put batches spread evenly over the queues,
keyed puts into waves, and put groups into runs of ids.
"""

from __future__ import annotations

import threading
from typing import Sequence, TypeVar

from daskqueue.queue.ring import HashRing

__all__ = ["Router", "batch_count", "even_ranges", "waves", "consecutive_runs"]

T = TypeVar("T")


class Router:
    """The routing of a pool of queues ``nodes``; ``typed`` pools route by message type."""

    def __init__(self, nodes: Sequence[int], *, typed: bool) -> None:
        self._rr = 0  # the next round-robin position
        # assign() takes a run of round-robin positions at once: calls from several threads
        # (the *_async forms) must not interleave theirs, or neither would be spread evenly.
        self._rr_lock = threading.Lock()
        self.typed = typed
        self.route_to(nodes)

    def route_to(self, nodes: Sequence[int]) -> None:
        """New messages go to queues ``nodes`` from now on (keys and types by the rings)."""
        self.targets: list[int] = list(nodes)
        self._key_ring = HashRing(self.targets)
        self._type_ring = HashRing(self.targets) if self.typed else None

    def route(self, type: str | None, key: str | None) -> int | None:
        """The queue every message of a submission goes to (a typed pool's queue for its
        type; a key's queue when the submission has one ``key``), or None: round-robin."""
        if self._type_ring is not None:
            return self._type_ring.node(type)
        return None if key is None else self._key_ring.node(key)

    def key_queue(self, key: str) -> int:
        """The queue of routing key ``key``."""
        return self._key_ring.node(key)

    def next_target(self) -> int:
        """The next queue in round-robin order."""
        return self.assign(1, None)[0]

    def pick(self, fixed: int | None) -> int:
        """``fixed`` if a submission is routed to one queue, else the next in turn."""
        return self.next_target() if fixed is None else fixed

    def assign(self, count: int, fixed: int | None) -> list[int]:
        """The queue of each of a call's ``count`` batches: all ``fixed``, or the next
        ``count`` queues in round-robin order, taken at once (so consecutive, whatever other
        threads send meanwhile). With a batch count from :func:`batch_count` and sizes from
        :func:`even_ranges`, every queue gets the same number of messages, give or take one."""
        if fixed is not None:
            return [fixed] * count
        targets = self.targets
        with self._rr_lock:
            start = self._rr
            # Whole rounds would start every call at the same queue, which would get the
            # larger batches each time (even_ranges): the next call starts one further.
            self._rr += count + (count % len(targets) == 0)
        return [targets[(start + i) % len(targets)] for i in range(count)]

    def spread(self, fixed: int | None) -> int:
        """Over how many queues a submission routed to ``fixed`` (or round-robin) goes."""
        return len(self.targets) if fixed is None else 1


def batch_count(n: int, *, spread: int, put_batch_size: int) -> int:
    """How many put batches a call of ``n`` messages over ``spread`` queues takes: whole
    rounds of one batch per queue (as few as keep each batch within ``put_batch_size``), so
    that round-robin gives every queue the same number of batches; ``n`` when there are
    fewer messages than queues (one each), and at least one."""
    if n <= spread:
        return max(1, n)
    rounds = -(-n // (spread * put_batch_size))
    return spread * rounds


def even_ranges(n: int, count: int) -> list[range]:
    """Positions ``0 .. n`` cut into ``count`` consecutive ranges whose sizes differ by at
    most one (the larger first); empty ranges are left out."""
    size, extra = divmod(n, max(1, count))
    out, lo = [], 0
    for i in range(count):
        hi = lo + size + (1 if i < extra else 0)
        if hi > lo:
            out.append(range(lo, hi))
        lo = hi
    return out


def waves(keyed: list[tuple[int, T]]) -> list[list[tuple[int, T]]]:
    """Keyed batches ``(queue, batch)`` in waves of at most one per queue, in order: a wave's
    puts go out at once, a queue's next batch only once its previous one was answered, so a
    key's later messages never get lower sequence numbers than its earlier ones."""
    out: list[list[tuple[int, T]]] = []
    sent: dict[int, int] = {}
    for q, batch in keyed:
        k = sent.get(q, 0)
        sent[q] = k + 1
        if k == len(out):
            out.append([])
        out[k].append((q, batch))
    return out


def consecutive_runs(first_seq: int, positions: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(first seq, count, first position)`` of each run of consecutive input positions of a
    put group whose messages got the seqs from ``first_seq`` on."""
    if isinstance(positions, range) and positions.step == 1:
        return [(first_seq, len(positions), positions.start)]
    runs: list[tuple[int, int, int]] = []
    for k, p in enumerate(positions):
        if runs and runs[-1][2] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, runs[-1][2])
        else:
            runs.append((first_seq + k, 1, p))
    return runs
