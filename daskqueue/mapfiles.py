"""The files of a ``daskqueue map`` job (see :mod:`daskqueue.mapjob` for how a job resumes):
``state.json`` and ``task-ids.bin`` (which job, what was put), ``done.jsonl`` (the journal of
outcomes) and the output file. Each is written so that a kill at any point leaves it readable:
a torn last line is cut on the next open, ``state.json`` is replaced whole.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from array import array
from pathlib import Path
from typing import Any, Callable

from daskqueue.errors import RemoteTaskError
from daskqueue.messages import make_id

__all__ = ["UsageError", "State", "Journal", "Output", "IndexSet", "outcome_record", "read_whole_lines",
           "scan_whole_lines", "STATE_FORMAT", "NO_ID", "IDS_FILE", "LOAD_BATCH"]

logger = logging.getLogger("daskqueue")

STATE_FORMAT = 1

#: The id ``task-ids.bin`` keeps for an index that was not put (its outcome was known
#: already): no task has it (every task id is below 2**63, see :func:`~daskqueue.messages.make_id`).
NO_ID = (1 << 64) - 1

#: The put tasks' ids, 8 bytes each, by item index. ``ids.bin`` held them in the id layout
#: of daskqueue 0.3.0 (``seq << 16 | queue``); a job resumed from it has them converted.
IDS_FILE = "task-ids.bin"
_OLD_IDS_FILE = "ids.bin"


class UsageError(Exception):
    """A mistake on the command line (exit status 2)."""


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def read_whole_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON records of ``path`` (see :func:`scan_whole_lines`), as a list."""
    records: list[dict[str, Any]] = []
    scan_whole_lines(path, records.append)
    return records


def scan_whole_lines(path: Path, each: Callable[[dict[str, Any]], None]) -> None:
    """Call ``each(record)`` for the JSON records of ``path`` (a journal or an output file of
    ours), one per line, up to the first line a kill tore (unfinished, or not a record with
    an ``index``): the file is cut there, so that what is appended next starts on a line of
    its own. Nothing is kept here: a file of any length is read in constant memory."""
    if not path.exists():
        return
    good = 0
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                rec = json.loads(line)
                rec["index"]
            except (json.JSONDecodeError, KeyError, TypeError):
                break
            each(rec)
            good += len(line)
    os.truncate(path, good)


class IndexSet:
    """A set of item indices from 0, one byte per index up to the largest (a job of 100
    million items: 100 MB, not the gigabytes a ``set`` of ints takes)."""

    def __init__(self) -> None:
        self._flags = bytearray()
        self._count = 0
        self._floor = 0  # every index below it is in the set (a set only grows)

    def add(self, i: int) -> bool:
        """Add ``i``; return whether it is new."""
        flags = self._flags
        if i >= len(flags):
            flags.extend(bytes(max(i + 1 - len(flags), len(flags))))  # grow by doubling
        if flags[i]:
            return False
        flags[i] = 1
        self._count += 1
        return True

    def __contains__(self, i: object) -> bool:
        return isinstance(i, int) and 0 <= i < len(self._flags) and self._flags[i] == 1

    def __len__(self) -> int:
        return self._count

    def first_missing(self, start: int = 0) -> int:
        """The smallest index from ``start`` on that is not in the set. Asked from below the
        last answer from 0, the search starts at that answer, not at ``start`` (a job asks
        at every poll: a scan of 100 million flags each time otherwise)."""
        begin = max(start, self._floor)
        found = self._flags.find(0, begin)
        first = max(begin, len(self._flags)) if found < 0 else found
        if start <= self._floor:
            self._floor = first
        return first


#: Journal records read back on resume are handed on this many at a time (see :class:`Journal`).
LOAD_BATCH = 10_000


class Journal:
    """``done.jsonl``: one line per outcome, fsynced per batch; read back on resume (a
    torn last line, from a kill mid-write, is dropped).

    Kept in memory: which items are done (``done``) and how many failed (``failed``), never
    the records: those read back are handed to ``loaded(records)`` as the file is scanned,
    at most ``LOAD_BATCH`` at a time (the output writes the ones it lacks), so a resume holds
    a batch, not the journal (every record of it when the output is stdout).
    """

    def __init__(self, path: Path | None, loaded: Callable[[list[dict[str, Any]]], None] = lambda records: None
                 ) -> None:
        self.path = path
        self.done = IndexSet()
        self.failed = 0
        self._file = None
        if path is None:
            return
        batch: list[dict[str, Any]] = []

        def load(rec: dict[str, Any]) -> None:
            if self.done.add(rec["index"]):
                self.failed += "error" in rec
                batch.append(rec)
                if len(batch) >= LOAD_BATCH:
                    loaded(batch[:])
                    batch.clear()

        scan_whole_lines(path, load)
        if batch:
            loaded(batch)
        self._file = open(path, "a", encoding="utf-8")

    def __len__(self) -> int:
        """How many items have their outcome journaled."""
        return len(self.done)

    def add(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Record these outcomes (the new ones); return the new ones."""
        new = [r for r in records if self.done.add(r["index"])]
        self.failed += sum(1 for r in new if "error" in r)
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
    With ``resume`` (a durable job run again) it keeps the lines already there and writes the
    rest; without, an existing file is written afresh (its lines belong to an earlier job
    this run knows nothing of). ``input_of(index)`` is the input item of a line, asked once
    per line written."""

    def __init__(self, path: str | None, input_of: Callable[[int], Any], ordered: bool, *,
                 resume: bool = True) -> None:
        self.input_of = input_of
        self.ordered = ordered
        self.written = IndexSet()
        self.next = 0
        self.pending: dict[int, dict[str, Any]] = {}
        if path is None or path == "-":
            self.file = sys.stdout
            return
        if not resume:
            self.file = open(path, "w", encoding="utf-8")
            return
        scan_whole_lines(Path(path), lambda rec: self.written.add(rec["index"]))
        self.next = self.written.first_missing(0)
        self.file = open(path, "a", encoding="utf-8")

    def add(self, records: list[dict[str, Any]]) -> None:
        lines = []
        for r in records:
            if r["index"] in self.written:
                continue
            if self.ordered:
                self.pending[r["index"]] = r
            else:
                lines.append(self._line(r))
        while self.ordered and self.next in self.pending:
            lines.append(self._line(self.pending.pop(self.next)))
            self.next = self.written.first_missing(self.next)
        if lines:
            self.file.write("".join(lines))
            self.file.flush()

    def _line(self, record: dict[str, Any]) -> str:
        """The output line of ``record``; its item counts as written from now on (its input
        is asked for first: once written, the input is not kept for it)."""
        line = json.dumps(_output_line(record, self.input_of(record["index"]))) + "\n"
        self.written.add(record["index"])
        return line

    def close(self) -> None:
        if self.file is not sys.stdout:
            self.file.close()


def _output_line(record: dict[str, Any], item: Any) -> dict[str, Any]:
    """``{"index", "input", "result"}`` or ``{"index", "input", "error", "traceback"}``."""
    if "error" in record:
        return {"index": record["index"], "input": item, "error": record["error"], "traceback": record["traceback"]}
    return {"index": record["index"], "input": item, "result": record["result"]}


class State:
    """``state.json`` and ``task-ids.bin`` of a durable job (None without ``--durable``)."""

    def __init__(self, root: Path | None, spec: str, input_path: str, as_json: bool, n: int) -> None:
        self.root = root
        self.submitted = 0
        self.ids = array("Q")
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
            self._load_ids(root)
        self.job = job
        self._save()

    def _load_ids(self, root: Path) -> None:
        ids_path, old_path = root / IDS_FILE, root / _OLD_IDS_FILE
        if not ids_path.exists() and old_path.exists():
            self._convert_old_ids(old_path, ids_path)
        if ids_path.exists():  # none yet if the job stopped before its first put
            with open(ids_path, "rb") as f:  # read into the array: no second copy
                self.ids.fromfile(f, min(self.submitted, os.fstat(f.fileno()).st_size // 8))
        old_path.unlink(missing_ok=True)  # converted (a crash may have left it after the rename)

    @staticmethod
    def _convert_old_ids(old_path: Path, ids_path: Path) -> None:
        """Rewrite ``ids.bin`` (ids ``seq << 16 | queue``) as ``task-ids.bin`` (this
        version's ids), through a temporary file: a crash leaves one whole file or the other."""
        old = array("Q")
        with open(old_path, "rb") as f:
            old.fromfile(f, os.fstat(f.fileno()).st_size // 8)
        new = array("Q", (i if i == NO_ID else make_id(i & 0xFFFF, i >> 16) for i in old))
        tmp = ids_path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(new.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ids_path)
        logger.info("%s: task ids converted to this version's layout (%s)", old_path, ids_path.name)

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
            path = self.root / IDS_FILE
            with open(path, "r+b" if path.exists() else "wb") as f:
                f.seek(len(self.ids) * 8)
                f.write(chunk.tobytes())
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
        self.ids.extend(chunk)
        self.submitted += len(ids)
        self._save()

    def forget_unsettled(self, done: IndexSet) -> None:
        """Items put but with no outcome (not in ``done``) and nothing pending were lost:
        let a rerun put them again, from the first of them on (the items after it that have
        an outcome are not put again: see ``mapjob.next_chunk``)."""
        if self.root is None:
            return
        self.submitted = min(done.first_missing(0), self.submitted)
        self.ids = self.ids[: self.submitted]
        self._save()

    def index_of(self, task_id: int, start: int = 0) -> int | None:
        """The index of the item put as ``task_id``, looked for from index ``start`` on (the
        first item without an outcome). Searched from the newest put back, a block of
        ``_SEARCH_BLOCK`` ids at a time: a failed task was usually put lately, and nothing is
        kept between calls (a map of the ids from ``start`` on, with ``start`` stuck behind a
        slow item, grew with the input and was rebuilt after every put)."""
        needle = array("Q", [task_id]).tobytes()
        hi = len(self.ids)
        while hi > start:
            lo = max(start, hi - _SEARCH_BLOCK)
            block = self.ids[lo:hi].tobytes()
            at = block.rfind(needle)
            while at >= 0 and at % 8:  # a match across two ids: look further back
                at = block.rfind(needle, 0, at + 7)
            if at >= 0:
                return lo + at // 8
            hi = lo
        return None


#: Ids searched at a time by :meth:`State.index_of` (a 512 KiB copy).
_SEARCH_BLOCK = 1 << 16


def outcome_record(task_id: int, outcome: Any, state: State, start: int = 0) -> dict[str, Any] | None:
    """The journal record of one outcome (None: a failure whose item is not known yet);
    ``start``: the first index without an outcome (a failure's item is looked for from it)."""
    if isinstance(outcome, RemoteTaskError):
        index = state.index_of(task_id, start)
        if index is None:
            return None
        return {"index": index, "error": f"{outcome.exc_type}: {outcome.exc_message}",
                "traceback": outcome.remote_traceback, "task_id": task_id}
    index, value = outcome
    return {"index": index, "result": _jsonable(value)}
