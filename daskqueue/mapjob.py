"""``daskqueue map MODULE:FUNC INPUT``: the main job from a shell, resumable.

Each line of INPUT (text, or JSON with ``--json``; ``-`` for stdin) becomes one task
``FUNC(item)``; the output holds one JSON line per item, ``{"index", "input", "result"}`` or
``{"index", "input", "error", "traceback"}``, in input order (or as they finish with
``--unordered``). With ``--durable DIR`` the job survives a crash or a walltime kill: running
the same command again resumes it. How resuming works:

* ``DIR/queues`` is a durable pool: messages not yet run, results not yet fetched and dead
  letters are all there after a crash;
* ``DIR/state.json`` says which job this is (function, input) and how many items were put;
  ``DIR/ids.bin`` holds every put task's id (8 bytes each), to name a failure's item;
* ``DIR/done.jsonl`` journals every outcome (flushed and fsynced) before the next fetch lets
  the queue forget it: an item is either journaled or still in the queue, never lost;
* the output is written from the journal, so a rerun completes it without duplicates.

Items are put 50,000 at a time, at most two such chunks ahead of the outcomes, so client
memory does not grow with the input (but for the ordered output's reordering window).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from array import array
from pathlib import Path
from typing import Any, Callable

from daskqueue.errors import RemoteTaskError

__all__ = ["run_map", "call_indexed"]

logger = logging.getLogger("daskqueue")

CHUNK = 50_000
STATE_FORMAT = 1


def call_indexed(func: Callable[[Any], Any], index: int, item: Any) -> tuple[int, Any]:
    """What each task runs: ``func(item)``, returned with the item's index."""
    return index, func(item)


class UsageError(Exception):
    """A mistake on the command line (exit status 2)."""


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


def read_items(path: str, as_json: bool) -> list[Any]:
    """The items of INPUT, one per line (a trailing newline is not part of the item)."""
    try:
        stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from e
    try:
        items = []
        for number, line in enumerate(stream, 1):
            line = line[:-1] if line.endswith("\n") else line
            if as_json:
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UsageError(f"{path}:{number}: not JSON ({e})") from e
            else:
                items.append(line)
        return items
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e}") from e
    finally:
        if stream is not sys.stdin:
            stream.close()


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def read_whole_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON records of ``path`` (a journal or an output file of ours), one per line, up
    to the first line a kill tore (unfinished, or not a record with an ``index``): the file
    is cut there, so that what is appended next starts on a line of its own."""
    if not path.exists():
        return []
    records, good = [], 0
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                rec = json.loads(line)
                rec["index"]
            except (json.JSONDecodeError, KeyError, TypeError):
                break
            records.append(rec)
            good += len(line)
    os.truncate(path, good)
    return records


class Journal:
    """``done.jsonl``: one line per outcome, fsynced per batch; read back on resume (a
    torn last line, from a kill mid-write, is dropped)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: dict[int, dict[str, Any]] = {}
        self._file = None
        if path is None:
            return
        for rec in read_whole_lines(path):
            self.records.setdefault(rec["index"], rec)
        self._file = open(path, "a", encoding="utf-8")

    def add(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Record these outcomes (the new ones); return the new ones."""
        new = [r for r in records if r["index"] not in self.records]
        for r in new:
            self.records[r["index"]] = r
        if self._file is not None and new:
            self._file.write("".join(json.dumps(r) + "\n" for r in new))
            self._file.flush()
            os.fsync(self._file.fileno())
        return new

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Output:
    """The output file: in input order (written as the prefix completes) or as they finish.
    On resume it keeps the lines already there and writes the rest."""

    def __init__(self, path: str | None, items: list[Any], ordered: bool) -> None:
        self.items = items
        self.ordered = ordered
        self.written: set[int] = set()
        self.next = 0
        self.pending: dict[int, dict[str, Any]] = {}
        if path is None or path == "-":
            self.file = sys.stdout
            return
        self.written.update(rec["index"] for rec in read_whole_lines(Path(path)))
        while self.next in self.written:
            self.next += 1
        self.file = open(path, "a", encoding="utf-8")

    def add(self, records: list[dict[str, Any]]) -> None:
        lines = []
        for r in records:
            if r["index"] in self.written:
                continue
            if not self.ordered:
                lines.append(r)
                self.written.add(r["index"])
            else:
                self.pending[r["index"]] = r
        while self.ordered and self.next in self.pending:
            r = self.pending.pop(self.next)
            lines.append(r)
            self.written.add(self.next)
            self.next += 1
            while self.next in self.written:
                self.next += 1
        if lines:
            self.file.write("".join(json.dumps(_output_line(r, self.items[r["index"]])) + "\n" for r in lines))
            self.file.flush()

    def close(self) -> None:
        if self.file is not sys.stdout:
            self.file.close()


def _output_line(record: dict[str, Any], item: Any) -> dict[str, Any]:
    """``{"index", "input", "result"}`` or ``{"index", "input", "error", "traceback"}``."""
    if "error" in record:
        return {"index": record["index"], "input": item, "error": record["error"], "traceback": record["traceback"]}
    return {"index": record["index"], "input": item, "result": record["result"]}


class State:
    """``state.json`` and ``ids.bin`` of a durable job (None without ``--durable``)."""

    def __init__(self, root: Path | None, spec: str, input_path: str, as_json: bool, n: int) -> None:
        self.root = root
        self.submitted = 0
        self.ids = array("Q")
        self._by_id: dict[int, int] | None = None
        if root is None:
            return
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        job = {"format": STATE_FORMAT, "func": spec, "input": input_path, "json": as_json, "items": n}
        path = root / "state.json"
        if path.exists():
            known = json.loads(path.read_text())
            mine = {k: known.get(k) for k in job}
            if mine != job:
                raise UsageError(f"{root} holds another job ({known.get('func')} over {known.get('input')}, "
                                 f"{known.get('items')} items): use another --durable directory")
            self.submitted = known["submitted"]
            with open(root / "ids.bin", "rb") as f:
                data = f.read()
            self.ids.frombytes(data[: len(data) // 8 * 8])
            self.ids = self.ids[: self.submitted]
        self.job = job
        self._save()

    def _save(self) -> None:
        if self.root is None:
            return
        tmp = self.root / "state.json.tmp"
        tmp.write_text(json.dumps(dict(self.job, submitted=self.submitted)))
        os.replace(tmp, self.root / "state.json")

    def put(self, ids: list[int]) -> None:
        """A chunk was put: persist its ids, then the count (a crash between puts it again)."""
        chunk = array("Q", ids)
        if self.root is not None:
            with open(self.root / "ids.bin", "r+b" if (self.root / "ids.bin").exists() else "wb") as f:
                f.seek(len(self.ids) * 8)
                f.write(chunk.tobytes())
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
        self.ids.extend(chunk)
        self.submitted += len(ids)
        self._save()
        self._by_id = None

    def index_of(self, task_id: int) -> int | None:
        if self._by_id is None:
            self._by_id = {t: i for i, t in enumerate(self.ids)}
        return self._by_id.get(task_id)


def outcome_record(task_id: int, outcome: Any, state: State) -> dict[str, Any] | None:
    """The journal record of one outcome (None: a failure whose item is not known yet)."""
    if isinstance(outcome, RemoteTaskError):
        index = state.index_of(task_id)
        if index is None:
            return None
        return {"index": index, "error": f"{outcome.exc_type}: {outcome.exc_message}",
                "traceback": outcome.remote_traceback, "task_id": task_id}
    index, value = outcome
    return {"index": index, "result": _jsonable(value)}


def run_map(args: argparse.Namespace) -> int:
    """The ``map`` command; returns the exit status."""
    from distributed import Client, LocalCluster

    from daskqueue import ConsumerPool, QueuePool

    try:
        func = load_function(args.func)
        items = read_items(args.input, args.json)
        if args.input == "-" and args.durable:
            raise UsageError("--durable needs INPUT to be a file (a rerun reads it again)")
        root = Path(args.durable).resolve() if args.durable else None
        state = State(root, args.func, os.path.abspath(args.input) if args.input != "-" else "-",
                      args.json, len(items))
    except UsageError as e:
        print(f"daskqueue map: {e}", file=sys.stderr)
        return 2
    journal = Journal(root / "done.jsonl" if root else None)
    output = Output(args.out, items, ordered=not args.unordered)
    output.add(list(journal.records.values()))
    cluster = None
    try:
        if args.scheduler:
            client = Client(args.scheduler, timeout="30s")
        else:
            cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=None,
                                   silence_logs=logging.ERROR)
            client = Client(cluster)
        try:
            n_workers = len(client.scheduler_info(n_workers=-1)["workers"])
            options: dict[str, Any] = dict(max_retries=args.max_retries, time_limit_s=args.time_limit)
            if root is not None:
                options.update(durability="durable", dirpath=str(root / "queues"))
            n_queues = args.queues or max(1, n_workers)
            if root is not None:  # a resumed job keeps its queues, whatever the workers now
                n_queues = max(n_queues, _known_queues(root / "queues"))
            qp = QueuePool(client, n_queues, name=f"map-{args.func}", **options)
            cp = ConsumerPool(client, qp)
            try:
                cp.start()
                return _drive(qp, cp, func, items, state, journal, output, progress=not args.no_progress)
            finally:
                cp.close()
                qp.close()
        finally:
            client.close()
    finally:
        journal.close()
        output.close()
        if cluster is not None:
            cluster.close()


def _drive(qp: Any, cp: Any, func: Callable[[Any], Any], items: list[Any], state: State, journal: Journal,
           output: Output, *, progress: bool) -> int:
    """Put what is left, journal outcomes as they come, until every item has one."""
    import functools

    from tqdm.auto import tqdm

    n = len(items)
    task = functools.partial(call_indexed, func)  # one function object: pickled once per put
    bar = tqdm(total=n, initial=len(journal.records), unit="item", desc="daskqueue map", disable=not progress,
               file=sys.stderr)
    unknown: dict[int, Any] = {}  # failures whose item is not in ids.bin (put just before a crash)
    inflight: list[int] = []  # sizes of the chunks put and not yet settled
    done_before = len(journal.records)
    put_now = 0
    try:
        while True:
            if state.submitted < n and sum(inflight) < 2 * CHUNK:
                first = state.submitted
                chunk = range(first, min(n, first + CHUNK))
                ids = qp.batch_submit([(task, i, items[i]) for i in chunk])
                state.put(ids)
                put_now += len(ids)
                inflight.append(len(ids))
            got = _take(qp)
            _record(got, state, journal, output, bar, unknown)
            settled = len(got)
            while inflight and settled:
                k = min(inflight[0], settled)
                inflight[0] -= k
                settled -= k
                if not inflight[0]:
                    inflight.pop(0)
            if len(journal.records) >= n:
                break
            if state.submitted >= n and not got and cp.settled_all():
                _record(_take(qp), state, journal, output, bar, unknown)  # what settled meanwhile
                if unknown:  # name their items from the dead letters' payloads
                    _resolve_unknown(qp, unknown, journal, output)
                    bar.update(len(journal.records) - bar.n)
                if len(journal.records) < n:
                    missing = n - len(journal.records)
                    print(f"daskqueue map: {missing:,} items have no outcome and none is pending "
                          "(lost with a transient queue?); run again to put them again", file=sys.stderr)
                    _forget_unsettled(state, journal)
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
    failed = sum(1 for r in journal.records.values() if "error" in r)
    print(f"daskqueue map: {n:,} items: {done_before:,} done before this run, {put_now:,} put in this run, "
          f"{failed:,} failed", file=sys.stderr)
    return 1 if failed else 0


def _record(got: list[tuple[int, Any]], state: State, journal: Journal, output: Output, bar: Any,
            unknown: dict[int, Any]) -> None:
    """Journal (then write out) the outcomes just taken."""
    records = []
    for task_id, outcome in got:
        rec = outcome_record(task_id, outcome, state)
        if rec is None:
            unknown[task_id] = outcome
        else:
            records.append(rec)
    new = journal.add(records)
    output.add(new)
    bar.update(len(new))
    if new:
        bar.set_postfix(failed=sum(1 for r in journal.records.values() if "error" in r), refresh=False)


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


def _forget_unsettled(state: State, journal: Journal) -> None:
    """Items put but with no outcome and nothing pending were lost: let a rerun put them."""
    if state.root is None:
        return
    state.submitted = min([i for i in range(len(state.ids)) if i not in journal.records], default=state.submitted)
    state.ids = state.ids[: state.submitted]
    state._save()
