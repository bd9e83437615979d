"""The pure state of a queue's talk with its peers (``daskqueue.queue.peer_state``): what it
heard, what it tells, and where it sends an idle consumer. No Dask, no clock: times are given."""

from __future__ import annotations

from daskqueue.queue.peer_state import UNTOLD, PeerBoard


def board(**kwargs) -> PeerBoard:
    return PeerBoard(0, announce_every_s=0.02, stale_after_s=3.0, **kwargs)


def test_an_older_announcement_arriving_late_is_ignored():
    b = board()
    assert b.heard(1, 5, number=2)
    assert not b.heard(1, None, number=1)  # sent before number 2: the peer still has work
    assert b.work_at == {1: (2, 5)}
    assert not b.heard(1, None, number=3)
    assert b.work_at == {}


def test_better_work_elsewhere_is_above_this_queues_top_priority_highest_first():
    b = board()
    b.heard(1, 3, 1)
    b.heard(2, 7, 1)
    b.heard(3, 1, 1)
    assert b.better_than(2, ignore=None) == [(2, 1), (1, 1)]
    assert b.better_than(2, ignore=[(2, 1)]) == [(1, 1)]
    assert b.better_than(None, ignore=None) == []  # nothing here: elsewhere() says where
    assert b.elsewhere(ignore=None) == [(2, 1), (1, 1), (3, 1)]
    assert b.elsewhere(ignore=None, min_priority=3) == [(2, 1), (1, 1)]


def test_keeping_only_the_current_peers_forgets_the_others_and_retells_the_state():
    b = board()
    b.heard(1, 3, 1)
    b.heard(2, 3, 1)
    b.announce(4, now=10.0)
    b.keep_only([2])
    assert b.work_at == {2: (1, 3)}
    assert b.announced is UNTOLD
    assert b.changed(4)  # the moved peer knows nothing: tell it again


def test_announcements_are_news_only_when_the_state_changed_or_new_work_came():
    b = board()
    assert b.changed(5)
    assert b.announce(5, now=1.0) == 1  # numbered from the epoch (0 here)
    assert not b.changed(5)
    assert b.wait_before_announcing(1.005) > 0
    assert b.wait_before_announcing(1.5) == 0
    assert b.changed(None)  # the work told of is gone
    assert b.changed(5)  # the same priority again is new work: a consumer told before went empty
    b.announce(5, now=2.0)
    assert not b.changed(5)


def test_type_counts_sum_the_fresh_reports_and_drop_stale_and_own_ones():
    b = board()
    b.report(1, {"a": (2, 1)}, now=10.0)
    b.report(2, {"a": (1, 0), "b": (4, 2)}, now=12.0)
    b.report(0, {"a": (100, 100)}, now=12.0)  # its own, echoed: never counted
    assert b.totals(now=12.5) == ({"a": 3, "b": 4}, {"a": 1, "b": 2})
    assert b.totals(now=14.0) == ({"a": 1, "b": 4}, {"a": 0, "b": 2})  # 1's report went stale


def test_lost_peers_work_is_forgotten():
    b = board()
    b.heard(1, 3, 1)
    b.heard(2, 3, 1)
    b.forget_work([1])
    assert list(b.work_at) == [2]


def test_a_lost_peers_type_counts_are_not_counted_until_it_reports_again():
    """A dead peer's running batches died with its consumers, and its ready messages come
    back in its reopened successor's report: counting the old report too would double them."""
    b = board()
    b.report(1, {"a": (5, 2)}, now=10.0)
    b.report(2, {"a": (1, 1)}, now=10.0)
    b.forget_work([1])
    assert b.totals(now=10.5) == ({"a": 1}, {"a": 1})
    b.report(1, {"a": (5, 0)}, now=10.6)  # the reopened queue 1
    assert b.totals(now=10.7) == ({"a": 6}, {"a": 1})


def test_a_reopened_peers_announcements_number_above_its_predecessors():
    """Issue 21: a queue reopened elsewhere is a new board with a later epoch; a peer that
    heard its predecessor's last announcement takes the successor's, not drops them."""
    before, after = PeerBoard(1, epoch=1_000), PeerBoard(1, epoch=5_000)
    b = board()
    for _ in range(30):
        last = before.announce(3, now=1.0)
    assert b.heard(1, 3, last)
    b.forget_work([1])  # its worker died
    b.keep_only([1])  # the pool's set_peers after the reopen: what was heard is kept
    assert b.heard(1, 2, after.announce(2, now=2.0))
    assert b.work_at == {1: (5_001, 2)}
    assert not b.heard(1, None, last)  # the predecessor's last word, arriving late: ignored
    assert b.work_at == {1: (5_001, 2)}


def test_a_successor_numbered_below_its_predecessor_learns_it_and_numbers_on_above_it():
    """A successor whose clock is behind its predecessor's: the peers ignore it until one of
    them says what it heard from that index; the successor then numbers above that and its
    state is news again."""
    successor, peer = PeerBoard(1, epoch=10), board()
    assert peer.heard(1, 4, 900)  # the predecessor's last announcement
    first = successor.announce(4, now=1.0)
    assert not peer.heard(1, 4, first)  # taken for an older one
    assert peer.last_heard(1) == 900  # what the peer tells index 1 with its own announcements
    assert successor.heard_of_me(peer.last_heard(1))
    assert successor.changed(4)  # announce again, even though the top is what was said
    n = successor.announce(4, now=1.1)
    assert n == 901 and peer.heard(1, 4, n)
    assert not successor.heard_of_me(peer.last_heard(1))  # the peer heard this incarnation: nothing to do
    assert not successor.heard_of_me(0)


def test_forgetting_a_removed_peer_forgets_what_was_heard_of_it():
    b = board()
    b.heard(1, 3, 7)
    b.keep_only([2])
    assert b.last_heard(1) == 0
