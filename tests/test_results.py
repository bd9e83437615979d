"""The client's result collector, alone (no cluster): results of moved messages under their
old ids, dead letters read again after a queue renumbered them, who ran what."""

from __future__ import annotations

import pickle

from daskqueue.messages import encode_error, make_id
from daskqueue.results import MapClaim, ResultCollector
from daskqueue.serialize import ResultRecord


class FakeQueues:
    """Answers ``fetch_outcomes`` from a script: per queue, a list of answers in turn."""

    def __init__(self, answers):
        self.answers = answers
        self.sent = []

    def call(self, q, method, *args):
        self.sent.append((q, method, args))
        return self.answers[q].pop(0)

    def answer(self, q, pending, deadline=None):
        return pending


def outcome(cursor, records, dead_cursor, dead):
    return (cursor, pickle.dumps(records), dead_cursor, dead)


ERROR = encode_error("ValueError", "no", "tb")


def test_results_of_moved_messages_come_back_under_their_old_ids_through_chains():
    c = ResultCollector(2, None, None)
    c.add_queues(1)
    c.moved([(10, 3, 2, 0), (20, 2, 2, 3)], 0)
    c._succeed_range(2, 0, ["a"])
    c._succeed_range(2, 3, list("de"))
    assert c.results == {make_id(0, 10): "a", make_id(0, 20): "d", make_id(0, 21): "e"}
    c.moved([(1, 2, 1, 100)], 2)  # seqs 1..2 of queue 2 moved on to queue 1
    assert c.queue_of(make_id(0, 12)) == 1  # result(id) long-polls the queue it is at now
    c._succeed_range(1, 99, ["x", "y", "z"])
    assert c.results[make_id(1, 99)] == "x"
    assert c.results[make_id(0, 11)] == "y" and c.results[make_id(0, 12)] == "z"


def test_a_move_is_forgotten_once_every_outcome_of_it_arrived():
    c = ResultCollector(2, None, None)
    c.moved([(10, 3, 1, 0)], 0)
    c._succeed_range(1, 0, ["a", "b"])
    assert c.has_moves()  # one outcome still to come under an old id
    c._fail(1, 2, ERROR, 1)
    assert not c.has_moves()  # the map of moves does not grow for good
    assert c.results == {make_id(0, 10): "a", make_id(0, 11): "b"} and make_id(0, 12) in c.failures


def test_a_duplicate_success_is_settled_once_so_map_waits_for_every_position():
    claim = MapClaim(3)
    c = ResultCollector(1, None, None)
    c.claim(0, 0, 3, claim, 0)
    record = ResultRecord(0, [(0, 2)], [], pickle.dumps(["a", "b"]), None)
    c._take_results([record, record])  # delivered twice (at-least-once)
    assert claim.settled == 2 and not claim.complete
    c._take_results([ResultRecord(0, [(2, 1)], [], pickle.dumps(["c"]), None)])
    assert claim.complete and claim.values == ["a", "b", "c"]


def test_dead_letters_renumbered_by_a_rebuilt_queue_are_read_again_and_counted_once():
    claim = MapClaim(3)
    queues = FakeQueues({0: [
        outcome(0, [], 2, [(0, 1, ERROR, None), (1, 1, ERROR, None)]),
        outcome(0, [], 1, []),  # rebuilt from disk: one dead letter replayed, numbering from 0
        outcome(0, [], 2, [(1, 1, ERROR, None), (2, 1, ERROR, None)]),
    ]})
    c = ResultCollector(1, queues.call, queues.answer)
    c.claim(0, 0, 3, claim, 0)
    c.poll()
    assert claim.settled == 2
    c.poll()
    assert queues.sent[-1][2][1] == 2  # sent the old cursor; the answer's is lower
    c.poll()
    assert queues.sent[-1][2][1] == 0  # so it read them all again
    assert claim.settled == 3 and sorted(claim.failures) == [0, 1, 2]


def test_who_ran_what_is_kept_while_the_results_are_held_and_forgotten_when_taken():
    c = ResultCollector(1, None, None)
    c._take_results([ResultRecord(0, [(0, 2)], [], pickle.dumps([1, 2]), None, 7),
                     ResultRecord(0, [(2, 1)], [], pickle.dumps([3]), None, 8)])
    assert [c.ran_by(make_id(0, s)) for s in range(4)] == [7, 7, 8, None]
    c.take({make_id(0, 0)})
    assert c.ran_by(make_id(0, 2)) == 8  # results still held
    c.take()
    assert c.ran_by(make_id(0, 2)) is None and c._ran == {}
