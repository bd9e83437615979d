"""as_completed(ids)'s claim: id runs, each outcome once, parked results handed over by slice."""

import pytest

from daskqueue.errors import RemoteTaskError
from daskqueue.messages import make_id
from daskqueue.results import ResultCollector
from daskqueue.stream_claim import StreamClaim, id_runs


def _collector(n=2):
    return ResultCollector(n, None, None)


@pytest.mark.timeout(10)
def test_id_runs_split_by_queue_and_gap_and_refuse_repeats():
    ids = [make_id(0, s) for s in range(3)] + [make_id(1, 5), make_id(1, 6), make_id(0, 10)]
    assert id_runs(ids) == [(0, 0, 3, 0), (1, 5, 2, 3), (0, 10, 1, 5)]
    assert id_runs([make_id(0, 1), make_id(0, 2), make_id(0, 2)]) is None
    assert id_runs([]) == []


@pytest.mark.timeout(10)
def test_a_position_is_reported_once_under_repeated_delivery():
    ids = [make_id(0, s) for s in range(4)]
    claim = StreamClaim(ids)
    claim.succeed(0, ["a", "b"])
    claim.succeed(1, ["B", "c"])  # position 1 again (at-least-once), position 2 new
    claim.fail(0, RemoteTaskError(ids[0], "E", "m", "", 1))  # known already: ignored
    got, values = claim.drain()
    assert got == ids[:3] and values == ["a", "b", "c"] and claim.settled == 3
    assert claim.missing() == [ids[3]] and claim.drain() == ([], [])


@pytest.mark.timeout(10)
def test_results_filed_before_the_claim_are_handed_over_and_the_rest_stay():
    c = _collector()
    c._succeed_here(0, 0, list(range(10)))
    c._succeed_here(1, 0, ["x"])
    ids = [make_id(0, s) for s in range(2, 6)]
    claim = StreamClaim(ids)
    assert c.claim_stream(claim, id_runs(ids))
    c._succeed_here(0, 5, [50, 60])  # seq 5 again (ignored by the claim) and seq 6 (not claimed)
    assert c.drain_stream(claim) == (ids, [2, 3, 4, 5])
    assert claim.complete
    assert c.results == {make_id(0, s): v for s, v in [(0, 0), (1, 1), (6, 60), (7, 7), (8, 8), (9, 9)]} | {
        make_id(1, 0): "x"}
    # Overlapping claims are refused (the caller takes from the dicts instead).
    assert not c.claim_stream(StreamClaim(ids[:1]), id_runs(ids[:1]))


@pytest.mark.timeout(10)
def test_a_released_claim_gives_back_what_nobody_drained():
    c = _collector()
    ids = [make_id(0, s) for s in range(3)]
    claim = StreamClaim(ids)
    assert c.claim_stream(claim, id_runs(ids))
    c._succeed_here(0, 0, ["a", "b"])
    err = RemoteTaskError(ids[2], "E", "m", "", 1)
    c._record_failure(0, 2, err)
    c.release_stream(claim)
    assert c.results == {ids[0]: "a", ids[1]: "b"} and c.failures == {ids[2]: err}
    c._succeed_here(0, 0, ["again"])  # after release: results' again
    assert c.results[ids[0]] == "again"


@pytest.mark.timeout(10)
def test_id_runs_of_long_runs_and_of_scattered_ids():
    ids = [make_id(1, s) for s in range(1000)] + [make_id(0, s) for s in range(7, 2000)] + [make_id(1, 5000)]
    assert id_runs(ids) == [(1, 0, 1000, 0), (0, 7, 1993, 1000), (1, 5000, 1, 2993)]
    scattered = [make_id(s % 3, s * 2) for s in range(50)]
    assert id_runs(scattered) == [(i % 3, i * 2, 1, i) for i in range(50)]
