"""Dead-letter administration of a queue pool: list, replay and purge."""

from __future__ import annotations

import logging
from typing import Any, Iterable

import cloudpickle

from daskqueue import defaults
from daskqueue.serialize import dead_rows
from daskqueue.errors import ConfigurationError, QueueHandedOffError
from daskqueue.messages import make_id, split_id
from daskqueue.queue.table import QueueTable
from daskqueue.results import DeadLetter, ResultCollector, dead_letter_of
from daskqueue.validate import check_number

__all__ = ["dead_letters", "replay_dead", "purge"]

logger = logging.getLogger("daskqueue")


def dead_letters(table: QueueTable, limit: int | None) -> list[DeadLetter]:
    """The dead-lettered messages of every reachable queue (see ``QueuePool.dead_letters``)."""
    check_number("limit", limit, integer=True, at_least=0, none_ok=True)
    calls = [(q, table.call(q, "dead_letters", limit)) for q in table.reachable()]
    rows = [(q, row) for q, pending in calls for row in dead_rows(table.answer_or_ask_again(q, pending))]
    digests: dict[int, set[bytes]] = {}
    for q, row in rows:
        if row[5] is not None:
            digests.setdefault(q, set()).add(row[5])
    funcs: dict[bytes, Any] = {}
    for q, wanted in digests.items():
        for digest, blob in table.ask(q, "get_functions", sorted(wanted)).items():
            try:
                funcs[digest] = cloudpickle.loads(blob)
            except Exception as e:
                logger.debug("dead letters: function %s not loadable here: %s", digest.hex()[:12], e)
    blobs: dict[int, Any] = {}  # each packed blob unpickled once for the whole listing
    out = [dead_letter_of(q, row, funcs, blobs) for q, row in rows]
    return out if limit is None else out[:limit]


def replay_dead(table: QueueTable, collector: ResultCollector, ids: Iterable[int] | None) -> int:
    """Put dead letters back as ready (see ``QueuePool.replay_dead``); how many."""
    calls = [(q, table.call(q, "replay_dead", seqs)) for q, seqs in _ids_by_queue(table, ids).items()]
    n = 0
    for q, pending in calls:
        # Asked again only if the old actor did none of it: a replay made twice loses ids.
        runs = table.answer_or_ask_again(q, pending, retry=QueueHandedOffError, attempts=defaults.PUT_ATTEMPTS)
        collector.forget_failures([make_id(*collector.given_id(q, s)) for s, _, _, _ in runs])
        collector.moved(runs, q)
        n += len(runs)
    return n


def purge(table: QueueTable, *, dead: bool, ready: bool) -> dict[str, int]:
    """Drop dead letters and/or waiting messages of every queue; the counts dropped (a purge
    made again after a durable queue's worker died with it in flight does not count what the
    lost call dropped, if anything)."""
    calls = [(q, table.call(q, "purge", dead, ready)) for q in table.reachable()]
    counts = {"dead": 0, "ready": 0}
    for q, pending in calls:
        n_dead, n_ready = table.answer_or_ask_again(q, pending, attempts=defaults.PUT_ATTEMPTS)
        counts["dead"] += n_dead
        counts["ready"] += n_ready
    return counts


def _ids_by_queue(table: QueueTable, ids: Iterable[int] | None) -> dict[int, list[int] | None]:
    """``{queue: seqs}`` of task ids (``{queue: None}`` for every queue when ids is None)."""
    if ids is None:
        return {q: None for q in table.reachable()}
    out: dict[int, list[int] | None] = {}
    for task_id in ids:
        check_number("task id", task_id, integer=True, at_least=0)
        q, seq = split_id(task_id)
        if q >= len(table.handles) or q in table.removed:
            raise ConfigurationError(f"task id {task_id} names queue {q}, which the pool does not have")
        out.setdefault(q, []).append(seq)  # type: ignore[union-attr]
    return out
