"""The input and files of ``daskqueue map`` read lazily: items pulled only as far as asked and
held only while needed, counted without being kept, and a resumed output completed from the
journal with each line's input read again from the file."""

from __future__ import annotations

import json

import pytest

from daskqueue.mapfiles import IndexSet, Journal, Output, UsageError
from daskqueue.mapinput import Inputs, count_items, iter_items


class Counted:
    def __init__(self, items):
        self.items = iter(items)
        self.pulled = 0

    def __iter__(self):
        return self

    def __next__(self):
        x = next(self.items)
        self.pulled += 1
        return x


@pytest.mark.timeout(30)
def test_inputs_pull_only_as_far_as_asked_and_hold_only_what_is_needed():
    source = Counted(f"x{i}" for i in range(10_000))
    written = IndexSet()
    inputs = Inputs(source, None, needed=lambda i: i not in written)
    assert [inputs.peek(i) for i in range(3)] == ["x0", "x1", "x2"]
    assert source.pulled == 3
    assert inputs.take(1) == "x1"  # its last use: forgotten
    written.add(1)
    with pytest.raises(KeyError):
        inputs.take(1)
    written.add(5)  # written in an earlier run: not held when read past
    assert inputs.peek(6) == "x6" and source.pulled == 7
    with pytest.raises(KeyError):
        inputs.take(5)
    assert not inputs.ended_at(9_999) and inputs.n is None
    assert inputs.ended_at(10_000) and inputs.n == 10_000


@pytest.mark.timeout(30)
def test_a_file_is_counted_without_being_kept_and_a_bad_json_line_is_a_usage_error(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a\n\nb\nlast without newline")
    assert count_items(str(path), False) == 4 == len(list(iter_items(str(path), False)))
    assert list(iter_items(str(path), False))[1] == ""
    path.write_text("")
    assert count_items(str(path), False) == 0
    path.write_text('{"a": 1}\n[2]\nnot json\n')
    with pytest.raises(UsageError, match=":3: not JSON"):
        count_items(str(path), True)
    with pytest.raises(UsageError, match="cannot read"):
        count_items(str(tmp_path / "missing.txt"), False)


@pytest.mark.timeout(30)
def test_an_input_that_shrank_after_it_was_counted_is_a_usage_error():
    inputs = Inputs(iter(["a", "b"]), 3, needed=lambda i: True)
    with pytest.raises(UsageError, match="changed while the job ran"):
        inputs.ended_at(2)


@pytest.mark.timeout(30)
def test_a_resumed_ordered_output_is_completed_from_the_journal_with_inputs_read_again(tmp_path):
    items = [f"item{i}" for i in range(6)]
    (tmp_path / "in.txt").write_text("".join(x + "\n" for x in items))
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"index": 0, "input": "item0", "result": 0}) + "\n")
    journal_path = tmp_path / "done.jsonl"
    journal_path.write_text("".join(json.dumps({"index": i, "result": i}) + "\n" for i in (0, 1, 2, 4))
                            + json.dumps({"index": 5, "error": "E: x", "traceback": "tb"}) + "\n" + '{"ind')
    inputs = Inputs(iter_items(str(tmp_path / "in.txt"), False), 6, needed=lambda i: i not in output.written)
    output = Output(str(out), inputs.take, ordered=True)
    journal = Journal(journal_path, loaded=output.add)  # 0 is in the output already: not again
    assert len(journal) == 5 and journal.failed == 1 and 3 not in journal.done
    assert [json.loads(x)["index"] for x in out.read_text().splitlines()] == [0, 1, 2]  # 3 is missing
    assert journal.add([{"index": 3, "result": 3}, {"index": 4, "result": 4}]) == [{"index": 3, "result": 3}]
    output.add([{"index": 3, "result": 3}])
    output.close()
    journal.close()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["index"] for r in lines] == list(range(6))
    assert [r["input"] for r in lines] == items
    assert lines[5]["error"] == "E: x"
    assert [json.loads(x)["index"] for x in journal_path.read_text().splitlines()] == [0, 1, 2, 4, 5, 3]


@pytest.mark.timeout(30)
def test_an_index_set_takes_a_byte_per_index_and_finds_the_first_missing():
    s = IndexSet()
    assert s.add(0) and s.add(2) and not s.add(2)
    assert len(s) == 2 and 2 in s and 1 not in s and 10**9 not in s and -1 not in s
    assert s.first_missing(0) == 1 and s.first_missing(2) == 3
    s.add(1)
    assert s.first_missing(0) == 3


@pytest.mark.timeout(30)
def test_a_failed_items_index_is_found_among_those_in_flight(tmp_path):
    from daskqueue.mapfiles import State

    state = State(tmp_path / "job", "m:f", "in.txt", False, 6)
    state.put([100, 101, 102])
    assert state.index_of(101) == 1
    state.put([200, 201, 202])
    assert state.index_of(202, start=2) == 5 and state.index_of(102, start=2) == 2
    assert State(tmp_path / "job", "m:f", "in.txt", False, 6).index_of(201, start=3) == 4  # read back


@pytest.mark.timeout(30)
def test_a_file_is_read_as_many_items_as_counted_whatever_its_line_endings(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"a\rb\nc\r\nd")  # a lone \r is part of its item; \r\n ends a line
    assert count_items(str(path), False) == 3
    assert list(iter_items(str(path), False)) == ["a\rb", "c", "d"]
    path.write_bytes(b'"a\\rb"\r\n1\n')
    assert count_items(str(path), True) == 2 and list(iter_items(str(path), True)) == ["a\rb", 1]


@pytest.mark.timeout(30)
def test_an_input_that_grew_after_it_was_counted_is_a_usage_error():
    inputs = Inputs(iter(["a", "b", "c"]), 2, needed=lambda i: True)
    assert inputs.take(1) == "b" and not inputs.ended_at(1)
    with pytest.raises(UsageError, match="more than the 2 items counted"):
        inputs.ended_at(2)
    exact = Inputs(iter(["a", "b"]), 2, needed=lambda i: True)
    assert exact.ended_at(2) and exact.ended_at(5)


@pytest.mark.timeout(30)
def test_an_output_that_does_not_resume_writes_an_existing_file_afresh(tmp_path):
    # `daskqueue map` without --durable (resume=False) on an --out file of an earlier run: its
    # lines are not counted as written (a second run crashed with KeyError), the file restarts.
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps({"index": i, "input": "old", "result": 0}) + "\n" for i in range(3)))
    output = Output(str(out), lambda i: ["one", "two"][i], ordered=True, resume=False)
    assert len(output.written) == 0
    output.add([{"index": 1, "result": "TWO"}, {"index": 0, "result": "ONE"}])
    output.close()
    assert [(r["index"], r["input"], r["result"]) for r in map(json.loads, out.read_text().splitlines())] == [
        (0, "one", "ONE"), (1, "two", "TWO")]
