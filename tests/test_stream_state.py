"""The state of one ``imap`` stream (``daskqueue.queue.streaming._Stream``), without a
cluster: the window bounds what the client holds, whatever order outcomes arrive in."""

from __future__ import annotations

import pytest

from daskqueue.queue.streaming import StreamClaim, _Stream


def stream(items, *, window, chunk, ordered):
    released = []
    s = _Stream(iter(items), window, chunk, None, "raise", ordered, lambda items, offset: StreamClaim(len(items)),
                released.append)
    return s, released


def held(s):
    """Values the stream's chunks keep: every position of an unreleased chunk."""
    return sum(c.n for c in s.chunks)


@pytest.mark.timeout(10)
def test_unordered_with_one_slow_task_per_chunk_holds_no_more_than_the_window():
    s, released = stream(range(10_000), window=16, chunk=4, ordered=False)
    yielded = []
    for _ in range(20):
        s.fill()
        assert held(s) <= 16
        for c in s.chunks:  # every outcome but the chunk's first (its slow task) arrives
            if not c.complete:
                c.succeed(1, list(range(c.n - 1)))
        for c, start, end in s.ready():
            yielded += c.values[start:end]
    assert held(s) <= 16 and not released
    assert len(yielded) == s.yielded == 3 * len(s.chunks)


@pytest.mark.timeout(10)
def test_unordered_forgets_yielded_values_and_releases_a_chunk_once_all_yielded():
    s, released = stream(range(8), window=8, chunk=4, ordered=False)
    s.fill()
    first = s.chunks[0]
    first.succeed(1, ["b", "c", "d"])
    assert [(start, end) for _, start, end in s.ready()] == [(1, 4)]
    assert first.values == [None] * 4  # yielded values are not kept while position 0 waits
    first.succeed(0, ["a"])
    assert [(c.values[start:end]) for c, start, end in s.ready()] == [["a"]]
    assert released == [first] and s.chunks[0] is not first
    s.fill()
    assert s.exhausted and s.put == 8


@pytest.mark.timeout(10)
def test_ordered_window_counts_what_was_not_yielded():
    s, released = stream(range(100), window=8, chunk=4, ordered=True)
    s.fill()
    assert s.put == 8
    s.chunks[0].succeed(0, [0, 1, 2, 3])
    assert [c.values[a:b] for c, a, b in s.ready()] == [[0, 1, 2, 3]]
    assert len(released) == 1
    s.fill()
    assert s.put == 12 and s.in_flight() == 8


@pytest.mark.timeout(10)
def test_a_dropped_chunk_only_counts_what_arrives():
    c = StreamClaim(4)
    c.succeed(0, ["a"])
    c.drop()
    c.succeed(1, ["b", "c"])
    assert c.fresh == [] and c.values == [None] * 4 and c.settled == 3 and not c.complete
    c.succeed(3, ["d"])
    assert c.complete and c.fresh == []
