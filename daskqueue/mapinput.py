"""The input of a ``daskqueue map`` job, read lazily: one item per line of a file or stdin.

A file is read twice, never held: once at the start to count its items (and, with ``--json``,
to check every line parses, so that a bad input is a usage error before anything runs), and
once as the job goes. :class:`Inputs` keeps only the items the job still needs: those read
and not yet written to the output (a put item is needed again for its output line).
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any, Callable, Iterator

from daskqueue.mapfiles import UsageError

__all__ = ["Inputs", "iter_items", "count_items"]


def _open(path: str) -> Any:
    # Lines end at "\n" only, as count_items counts them: a universal-newline reader also
    # ends one at a lone "\r", so it read more items than were counted (the last ones never ran).
    try:
        if path == "-":
            return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline="\n")
        return open(path, encoding="utf-8", newline="\n")
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from e


def iter_items(path: str, as_json: bool) -> Iterator[Any]:
    """The items of INPUT (``-``: stdin), one per line: lines end at a newline only (a
    carriage return elsewhere is part of the item), and the newline or CR LF ending one is
    not part of its item. Parsed as JSON with ``as_json``. Raises :class:`UsageError` for a
    line that is not JSON or not UTF-8, or a file that cannot be read (at the first
    ``next()``)."""
    stream = _open(path)
    number = 0
    try:
        for number, line in enumerate(stream, 1):
            if line.endswith("\n"):
                line = line[:-2] if line.endswith("\r\n") else line[:-1]
            if as_json:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise UsageError(f"{path}:{number}: not JSON ({e})") from e
            else:
                yield line
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}:{number + 1}: not UTF-8 ({e.reason})") from e
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e}") from e
    finally:
        if path == "-":
            stream.detach()  # leaves stdin open
        else:
            stream.close()


def count_items(path: str, as_json: bool) -> int:
    """How many items the file ``path`` holds (one pass, nothing kept); with ``as_json``,
    every line is parsed on the way (a bad one raises :class:`UsageError`)."""
    if as_json:
        return sum(1 for _ in iter_items(path, True))
    n, last = 0, b"\n"
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                n += block.count(b"\n")
                last = block[-1:]
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from e
    return n + (last != b"\n")  # a last line without a newline is an item too


class Inputs:
    """Items by index, read forward once from ``items``; ``needed(i)`` says whether item
    ``i`` will be asked for (items read past and needed are held until taken).

    ``n`` is the number of items: given (a file counted first), or known once the input
    ended (stdin).
    """

    def __init__(self, items: Iterator[Any], n: int | None, needed: Callable[[int], bool]) -> None:
        self._items = items
        self._needed = needed
        self._held: dict[int, Any] = {}
        self._next = 0
        self._ended = False
        self.n = n

    def ended_at(self, i: int) -> bool:
        """Whether the input has no item ``i`` (reads up to it to know)."""
        self._read_to(i)
        return self.n is not None and i >= self.n

    def peek(self, i: int) -> Any:
        """Item ``i``, kept (it is asked for again)."""
        self._read_to(i)
        return self._held[i]

    def take(self, i: int) -> Any:
        """Item ``i``, forgotten here (its last use)."""
        self._read_to(i)
        return self._held.pop(i)

    def _read_to(self, i: int) -> None:
        while self._next <= i and (self.n is None or self._next < self.n):
            try:
                item = next(self._items)
            except StopIteration:
                if self.n is not None:
                    raise UsageError(f"the input ended at item {self._next:,} of the {self.n:,} counted at "
                                     "the start: it changed while the job ran") from None
                self.n = self._next
                return
            if self._needed(self._next):
                self._held[self._next] = item
            self._next += 1
        if self.n is not None and i >= self.n:
            self._check_ended()

    def _check_ended(self) -> None:
        """All ``n`` counted items were read: the input must end there (once checked)."""
        if self._ended:
            return
        try:
            next(self._items)
        except StopIteration:
            self._ended = True
            return
        raise UsageError(f"the input has more than the {self.n:,} items counted at the start: it changed "
                         "while the job ran")
