"""``daskqueue map MODULE:FUNC INPUT``: the main job from a shell, resumable.

Each line of INPUT (text, or JSON with ``--json``; ``-`` for stdin) becomes one task
``FUNC(item)``; the output holds one JSON line per item, ``{"index", "input", "result"}`` or
``{"index", "input", "error", "traceback"}``, in input order (or as they finish with
``--unordered``). With ``--durable DIR`` the job survives a crash or a walltime kill: running
the same command again resumes it. How resuming works (the files: :mod:`daskqueue.mapfiles`):

* ``DIR/queues`` is a durable pool: messages not yet run, results not yet fetched and dead
  letters are all there after a crash;
* ``DIR/state.json`` says which job this is (function, input) and how many items were put;
  ``DIR/task-ids.bin`` holds every put task's id (8 bytes each), to name a failure's item;
* ``DIR/done.jsonl`` journals every outcome (flushed and fsynced) before the next fetch lets
  the queue forget it: an item is either journaled or still in the queue, never lost;
* the output is written from the journal, so a rerun completes it without duplicates.

The input is read lazily (:mod:`daskqueue.mapinput`: a file is counted first, never held) and
items are put 50,000 at a time while fewer than two such chunks wait for their output line,
so client memory does not grow with the input: the journal and the output are known by one
byte per item (:class:`~daskqueue.mapfiles.IndexSet`), and ``task-ids.bin`` by eight.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Container
from pathlib import Path
from typing import Any, Callable

from daskqueue.mapfiles import NO_ID, Journal, Output, State, UsageError, outcome_record
from daskqueue.mapinput import Inputs, count_items, iter_items
from daskqueue.queue.config import default_n_queues
from daskqueue.scheduler_query import worker_threads

__all__ = ["run_map", "call_indexed", "UsageError"]

logger = logging.getLogger("daskqueue")

#: Items per put, and how many items put may wait for their output line (see ``_drive``).
CHUNK = 50_000
WINDOW = 2 * CHUNK


def call_indexed(func: Callable[[Any], Any], index: int, item: Any) -> tuple[int, Any]:
    """What each task runs: ``func(item)``, returned with the item's index."""
    return index, func(item)


def load_function(spec: str) -> Callable[[Any], Any]:
    """``module:function`` (dotted attributes allowed), imported from the current directory
    or the installed packages. A module of the current directory is pickled by value, so the
    workers need not be able to import it."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"FUNC must be MODULE:FUNCTION, got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"cannot import {module_name!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise UsageError(f"{module_name!r} has no {attr!r}")
    if not callable(obj):
        raise UsageError(f"{spec} is not callable")
    path = getattr(module, "__file__", None)
    if path and os.path.abspath(path).startswith(cwd + os.sep):
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)
    return obj


def next_chunk(inputs: Inputs, done: Container[int], first: int, end: int) -> tuple[int, list[int]]:
    """The chunk of indices ``first .. end`` to put: ``(stop, wanted)``, ``stop`` where the
    input ends (or ``end``), ``wanted`` the indices without an outcome. A resumed job puts
    again from its first item without one (:meth:`State.forget_unsettled`); the items after
    it that have one are not put again (with ``--unordered`` their output lines are written,
    and their input is not held any more)."""
    wanted = []
    for i in range(first, end):
        if inputs.ended_at(i):
            return i, wanted
        if i not in done:
            wanted.append(i)
    return end, wanted


def aligned_ids(first: int, stop: int, wanted: list[int], ids: list[int]) -> list[int]:
    """The ids of indices ``first .. stop`` as ``task-ids.bin`` keeps them (by index): ``ids`` for
    the ``wanted`` ones put, :data:`~daskqueue.mapfiles.NO_ID` for those not put."""
    if len(wanted) == stop - first:
        return ids
    aligned = [NO_ID] * (stop - first)
    for i, task_id in zip(wanted, ids):
        aligned[i - first] = task_id
    return aligned


def read_items(path: str, as_json: bool) -> list[Any]:
    """The items of INPUT as a list (the job itself reads them lazily: :mod:`daskqueue.mapinput`)."""
    return list(iter_items(path, as_json))


def run_map(args: argparse.Namespace) -> int:
    """The ``map`` command; returns the exit status (2: a :class:`UsageError`, found at the
    start or as the input is read: a line not JSON or not UTF-8, an input that changed)."""
    try:
        return _run_map(args)
    except UsageError as e:
        print(f"daskqueue map: {e}", file=sys.stderr)
        return 2


def _run_map(args: argparse.Namespace) -> int:
    from distributed import Client, LocalCluster

    from daskqueue import ConsumerPool, QueuePool

    func = load_function(args.func)
    if args.input == "-" and args.durable:
        raise UsageError("--durable needs INPUT to be a file (a rerun reads it again)")
    n = None if args.input == "-" else count_items(args.input, args.json)
    root = Path(args.durable).resolve() if args.durable else None
    state = State(root, args.func, os.path.abspath(args.input) if args.input != "-" else "-", args.json, n or 0)
    # The input is read as the job goes; an item is held from its reading to its output line.
    inputs = Inputs(iter_items(args.input, args.json), n, needed=lambda i: i not in output.written)
    output = Output(args.out, inputs.take, ordered=not args.unordered, resume=root is not None)
    journal = None
    cluster = None
    try:
        journal = Journal(root / "done.jsonl" if root else None, loaded=output.add)
        if args.scheduler:
            client = Client(args.scheduler, timeout="30s")
        else:
            cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=None,
                                   silence_logs=logging.ERROR)
            client = Client(cluster)
        try:
            options: dict[str, Any] = dict(max_retries=args.max_retries, time_limit_s=args.time_limit)
            if root is not None:
                options.update(durability="durable", dirpath=str(root / "queues"))
            qp = QueuePool(client, _queue_count(client, args.queues, root), name=f"map-{args.func}", **options)
            cp = ConsumerPool(client, qp)
            try:
                cp.start()
                return _drive(qp, cp, func, inputs, state, journal, output, progress=not args.no_progress)
            finally:
                cp.close()
                qp.close()
        finally:
            client.close()
    finally:
        if journal is not None:
            journal.close()
        output.close()
        if cluster is not None:
            cluster.close()


def _drive(qp: Any, cp: Any, func: Callable[[Any], Any], inputs: Inputs, state: State, journal: Journal,
           output: Output, *, progress: bool) -> int:
    """Put what is left, a chunk at a time while fewer than ``WINDOW`` items put wait for
    their output line, and journal outcomes as they come, until every item has one."""
    import functools

    from tqdm.auto import tqdm

    task = functools.partial(call_indexed, func)  # one function object: pickled once per put
    bar = tqdm(total=inputs.n, initial=len(journal), unit="item", desc="daskqueue map", disable=not progress,
               file=sys.stderr)
    unknown: dict[int, Any] = {}  # failures whose item is not in task-ids.bin (put just before a crash)
    done_before = len(journal)
    put_now = 0

    def may_put() -> bool:
        # Items put and not written out are held (their input, an ordered output's lines):
        # the window bounds them, whatever the input's length.
        return state.submitted - len(output.written) < WINDOW and not inputs.ended_at(state.submitted)

    try:
        while True:
            if may_put():
                first = state.submitted
                end = first + CHUNK if inputs.n is None else min(inputs.n, first + CHUNK)
                stop, wanted = next_chunk(inputs, journal.done, first, end)
                ids = qp.batch_submit([(task, i, inputs.peek(i)) for i in wanted]) if wanted else []
                state.put(aligned_ids(first, stop, wanted, ids))
                put_now += len(ids)
                if bar.total is None and inputs.n is not None:  # stdin ended: its length is known
                    bar.total = inputs.n
            got = _take(qp)
            _record(got, state, journal, output, bar, unknown)
            if inputs.n is not None and len(journal) >= inputs.n:
                break
            if not got and not may_put() and cp.settled_all():
                _record(_take(qp), state, journal, output, bar, unknown)  # what settled meanwhile
                if unknown:  # name their items from the dead letters' payloads
                    _resolve_unknown(qp, unknown, journal, output)
                    bar.update(len(journal) - bar.n)
                if may_put():  # a full window, emptied by what was just written: put on
                    continue
                if inputs.n is None or len(journal) < inputs.n:
                    missing = (inputs.n or state.submitted) - len(journal)
                    print(f"daskqueue map: {missing:,} items have no outcome and none is pending "
                          "(lost with a transient queue?); run again to put them again", file=sys.stderr)
                    state.forget_unsettled(journal.done)
                    return 1
                break
            if not got:
                time.sleep(0.05)
    finally:
        bar.close()
    if state.root is not None:
        # Every item has its outcome: what still waits is a second copy (put again after a
        # crash between a put and its record in state.json); drop it, not leave it for later.
        qp.purge(dead=False, ready=True)
    print(f"daskqueue map: {inputs.n:,} items: {done_before:,} done before this run, {put_now:,} put in this "
          f"run, {journal.failed:,} failed", file=sys.stderr)
    return 1 if journal.failed else 0


def _record(got: list[tuple[int, Any]], state: State, journal: Journal, output: Output, bar: Any,
            unknown: dict[int, Any]) -> None:
    """Journal (then write out) the outcomes just taken."""
    records = []
    start = journal.done.first_missing()  # items before it all have their outcome
    for task_id, outcome in got:
        rec = outcome_record(task_id, outcome, state, start)
        if rec is None:
            unknown[task_id] = outcome
        else:
            records.append(rec)
    new = journal.add(records)
    output.add(new)
    bar.update(len(new))
    if new:
        bar.set_postfix(failed=journal.failed, refresh=False)


def _queue_count(client: Any, asked: int | None, root: Path | None) -> int:
    """The queues of the job's pool: ``--queues``, else ``QueuePool``'s own default (the
    scale model: ``default_n_queues`` of the cluster's worker threads, asked of the
    scheduler; a durable pool's: 1). A resumed job keeps its queues, whatever the workers
    now."""
    if root is not None:
        return max(asked or 1, _known_queues(root / "queues"))
    return asked if asked is not None else default_n_queues(worker_threads(client))


def _known_queues(dirpath: Path) -> int:
    """How many queues the durable pool at ``dirpath`` holds (0: none yet)."""
    from daskqueue.queue.directory import POOL_FILE

    try:
        return int(json.loads((dirpath / POOL_FILE).read_text())["n_queues"])
    except (OSError, ValueError, KeyError):
        return 0


def _take(qp: Any) -> list[tuple[int, Any]]:
    """Every outcome the queues hold now (taken: the caller journals them before the next
    fetch, which lets the queues drop them)."""
    return qp.take_outcomes()


def _resolve_unknown(qp: Any, unknown: dict[int, Any], journal: Journal, output: Output) -> None:
    records = []
    for d in qp.dead_letters():
        if d.task_id in unknown and d.payload is not None:
            _, args, _ = d.payload
            outcome = unknown.pop(d.task_id)
            records.append({"index": args[0], "error": f"{outcome.exc_type}: {outcome.exc_message}",
                            "traceback": outcome.remote_traceback, "task_id": d.task_id})
    output.add(journal.add(records))
