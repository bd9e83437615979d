"""Resuming a ``daskqueue map`` job, without a cluster: what is put again, how a failure is
named, what a resume holds in memory."""

from __future__ import annotations

import json

import pytest

from daskqueue.mapfiles import NO_ID, IndexSet, Output
from daskqueue.mapinput import Inputs
from daskqueue.mapjob import aligned_ids, next_chunk


@pytest.mark.timeout(30)
def test_an_unordered_resume_puts_only_the_items_without_an_outcome(tmp_path):
    # An --unordered run wrote items 0..9 but 3 (lost), and put them all; the rerun puts
    # again from 3, the first without an outcome: 4..9 are written, their input not held.
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps({"index": i, "input": f"x{i}", "result": i}) + "\n"
                           for i in range(10) if i != 3))
    output = Output(str(out), lambda i: inputs.take(i), ordered=False)
    inputs = Inputs(iter(f"x{i}" for i in range(12)), 12, needed=lambda i: i not in output.written)
    done = IndexSet()
    for i in range(10):
        if i != 3:
            done.add(i)
    stop, wanted = next_chunk(inputs, done, 3, 12)
    assert (stop, wanted) == (12, [3, 10, 11])
    assert [inputs.peek(i) for i in wanted] == ["x3", "x10", "x11"]
    assert aligned_ids(3, stop, wanted, [30, 100, 110]) == [30] + [NO_ID] * 6 + [100, 110]
    output.close()


@pytest.mark.timeout(30)
def test_a_chunk_stops_where_a_stream_ends_and_ids_stay_by_index():
    inputs = Inputs(iter(["a", "b"]), None, needed=lambda i: True)
    assert next_chunk(inputs, IndexSet(), 0, 5) == (2, [0, 1])
    assert inputs.n == 2
    assert aligned_ids(0, 2, [0, 1], [7, 8]) == [7, 8]


@pytest.mark.timeout(30)
def test_a_resume_hands_the_journal_on_in_batches_not_whole(tmp_path, capsys):
    # Output to stdout writes nothing on a file: every journaled record is written again, so
    # they must go by batches (with keep=..., the whole journal was loaded into a list first).
    from daskqueue.mapfiles import LOAD_BATCH, Journal

    n = 2 * LOAD_BATCH + 5
    path = tmp_path / "done.jsonl"
    path.write_text("".join(json.dumps({"index": i, "result": i}) + "\n" for i in range(n)))
    inputs = Inputs(iter(range(n)), n, needed=lambda i: i not in output.written)
    output = Output(None, inputs.take, ordered=True)
    sizes = []

    def loaded(records):
        sizes.append(len(records))
        output.add(records)

    journal = Journal(path, loaded=loaded)
    assert max(sizes) <= LOAD_BATCH and sum(sizes) == n == len(journal)
    assert not hasattr(journal, "loaded")
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x)["index"] for x in lines] == list(range(n))
    journal.close()


@pytest.mark.timeout(60)
def test_naming_a_failed_item_keeps_nothing_that_grows_with_the_items_in_flight():
    # --unordered with the first item still running: the start of the search stays at 0
    # while ids are put; a failure's index is found without a map of every id put.
    import tracemalloc

    from daskqueue.mapfiles import State

    state = State(None, "m:f", "in.txt", False, 0)
    n = 300_000
    state.put(list(range(1000, 1000 + n)))
    tracemalloc.start()
    try:
        assert state.index_of(1000 + 7, start=0) == 7
        state.put([5 << 8])
        assert state.index_of(1000 + n - 1, start=0) == n - 1 and state.index_of(5 << 8, start=3) == n
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20  # a map of 300,000 ids: tens of MiB
    assert state.index_of(1000 + 7, start=8) is None and state.index_of(999) is None
    # An id whose bytes straddle two neighbours is no match.
    a = int.from_bytes(bytes([0, 0, 0, 0, 0x11, 0x22, 0x33, 0x44]), "little")
    b = int.from_bytes(bytes([0x55, 0x66, 0x77, 0x88, 0, 0, 0, 0]), "little")
    straddle = int.from_bytes(bytes([0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]), "little")
    state = State(None, "m:f", "in.txt", False, 0)
    state.put([straddle, a, b])
    assert state.index_of(straddle) == 0 and state.index_of(b) == 2
    assert state.index_of(straddle, start=1) is None


@pytest.mark.timeout(60)
def test_an_input_found_bad_while_read_is_a_usage_error_not_a_traceback(tmp_path, capsys):
    # Counting does not decode; reading item 0 again for its output line (a resume, before
    # any cluster starts) finds it is not UTF-8: exit status 2 and a message.
    import argparse

    from daskqueue.mapfiles import State
    from daskqueue.mapjob import run_map

    path = tmp_path / "in.txt"
    path.write_bytes(b"\xff\nok\n")
    root = tmp_path / "job"
    State(root, "json:dumps", str(path), False, 2)
    (root / "done.jsonl").write_text(json.dumps({"index": 0, "result": 1}) + "\n")
    args = argparse.Namespace(func="json:dumps", input=str(path), json=False, durable=str(root),
                              out=str(tmp_path / "out.jsonl"), unordered=False, scheduler=None, workers=1,
                              queues=None, max_retries=0, time_limit=None, no_progress=True)
    assert run_map(args) == 2
    assert "in.txt:1: not UTF-8" in capsys.readouterr().err


class FakeQueues:
    """Just the calls ``_drive`` makes on its pools (no Dask: ``_drive``'s own bookkeeping is
    under test). Item 0 fails under an id ``ids.bin`` does not hold (as one put just before a
    crash): it is named from its dead letter only once everything settled."""

    def __init__(self, fail_first=True):
        self.ready = []
        self.fail_first = fail_first
        self.put = []

    def batch_submit(self, calls):
        from daskqueue.errors import RemoteTaskError

        for _, i, item in calls:
            self.put.append(i)
            self.ready.append((999, RemoteTaskError(999, "ValueError", "bad", "tb", 1))
                              if i == 0 and self.fail_first else (1000 + i, (i, item.upper())))
        return [1000 + i for _, i, _ in calls]

    def purge(self, **kwargs):
        pass

    def take_outcomes(self):
        got, self.ready = self.ready, []
        return got

    def dead_letters(self):
        from types import SimpleNamespace

        return [SimpleNamespace(task_id=999, payload=(None, (0, "a"), {}))]

    def settled_all(self):
        return True


@pytest.mark.timeout(30)
def test_a_full_window_emptied_by_a_late_named_failure_puts_on_instead_of_giving_up(tmp_path, monkeypatch,
                                                                                  capsys):
    from daskqueue import mapjob
    from daskqueue.mapfiles import Journal, State

    monkeypatch.setattr(mapjob, "CHUNK", 2)
    monkeypatch.setattr(mapjob, "WINDOW", 2)
    items = ["a", "b", "c", "d"]
    inputs = Inputs(iter(items), 4, needed=lambda i: i not in output.written)
    output = Output(str(tmp_path / "out.jsonl"), inputs.take, ordered=True)
    journal = Journal(None)
    fake = FakeQueues()
    status = mapjob._drive(fake, fake, str.upper, inputs, State(None, "m:f", "in", False, 4), journal, output,
                           progress=False)
    output.close()
    assert "no outcome" not in capsys.readouterr().err
    assert status == 1 and len(journal) == 4 and journal.failed == 1
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["index"] for r in lines] == [0, 1, 2, 3] and lines[3]["result"] == "D"


@pytest.mark.timeout(30)
def test_forgetting_unsettled_items_asks_for_the_first_missing_not_each_item(tmp_path):
    from daskqueue.mapfiles import State

    class Asked(IndexSet):
        asked = 0

        def __contains__(self, i):
            Asked.asked += 1
            return super().__contains__(i)

    state = State(tmp_path / "job", "m:f", "in", False, 10)
    state.put(list(range(100, 110)))
    done = Asked()
    for i in (0, 1, 2, 4, 9):
        done.add(i)
    state.forget_unsettled(done)
    assert state.submitted == 3 and list(state.ids) == [100, 101, 102] and Asked.asked == 0
    assert State(tmp_path / "job", "m:f", "in", False, 10).submitted == 3


@pytest.mark.timeout(30)
def test_an_index_set_answers_the_first_missing_from_where_it_last_found_it():
    s = IndexSet()
    for i in (0, 1, 3, 4):
        s.add(i)
    assert s.first_missing() == 2 and s.first_missing(3) == 5 and s.first_missing(1) == 2
    s.add(2)
    assert s.first_missing() == 5 and s.first_missing(0) == 5
    s.add(6)
    assert s.first_missing(6) == 7 and s.first_missing() == 5
    s.add(5)
    assert s.first_missing() == 7 and s.first_missing(10) == 10


@pytest.mark.timeout(30)
def test_an_unordered_durable_job_resumed_after_a_lost_item_puts_only_it_and_completes(tmp_path, monkeypatch,
                                                                                     capsys):
    from daskqueue import mapjob
    from daskqueue.mapfiles import Journal, State

    monkeypatch.setattr(mapjob, "CHUNK", 2)
    monkeypatch.setattr(mapjob, "WINDOW", 4)
    items = [f"x{i}" for i in range(8)]
    root, out = tmp_path / "job", tmp_path / "out.jsonl"
    first = State(root, "m:f", "in", False, 8)
    first.put(list(range(100, 106)))  # 0..5 put; 3 was lost, 0..2, 4, 5 done and written
    (root / "done.jsonl").write_text("".join(json.dumps({"index": i, "result": i}) + "\n" for i in (0, 1, 2, 4, 5)))
    out.write_text("".join(json.dumps({"index": i, "input": items[i], "result": i}) + "\n" for i in (0, 1, 2, 4, 5)))

    def rerun():
        inputs = Inputs(iter(items), 8, needed=lambda i: i not in output.written)
        output = Output(str(out), inputs.take, ordered=False)
        journal = Journal(root / "done.jsonl", loaded=output.add)
        fake = FakeQueues(fail_first=False)
        state = State(root, "m:f", "in", False, 8)
        try:
            return mapjob._drive(fake, fake, str.upper, inputs, state, journal, output, progress=False), fake
        finally:
            journal.close()
            output.close()

    status, fake = rerun()  # 6, 7 are put; nothing pends for 3: it is found lost
    assert status == 1 and fake.put == [6, 7] and "1 items have no outcome" in capsys.readouterr().err
    status, fake = rerun()  # put again from 3 on, only what has no outcome
    assert status == 0 and fake.put == [3]
    assert sorted(json.loads(x)["index"] for x in out.read_text().splitlines()) == list(range(8))
