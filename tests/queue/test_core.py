"""Unit tests of the pure queue core: one behaviour per test, ``validate()`` after every call.

Every core here is wrapped in :class:`Validated`, which runs ``core.validate()`` after each
method call (even one that raises), so a broken invariant fails the test at the call that
broke it. Backoff jitter is 0 unless a test says otherwise, so retry delays are exactly
``base * 2**(attempt - 1)`` capped at ``max``: 1 s, 2 s, 4 s, 8 s, 8 s...
"""

from __future__ import annotations

import math

import pytest

from daskqueue.queue.core import LEASE_EXPIRED, Chunk, QueueCore, Transition

LEASE_TIMEOUT_S = 10.0
MAX_RETRIES = 2
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 8.0


class Validated:
    """Proxy of a ``QueueCore`` that validates the core after every method call."""

    def __init__(self, core: QueueCore) -> None:
        self.core = core
        core.validate()

    def __getattr__(self, name):
        attr = getattr(self.core, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            finally:
                self.core.validate()

        return call


def make_core(**overrides) -> Validated:
    config = dict(
        lease_timeout_s=LEASE_TIMEOUT_S,
        max_retries=MAX_RETRIES,
        retry_backoff_base_s=BACKOFF_BASE_S,
        retry_backoff_max_s=BACKOFF_MAX_S,
        retry_backoff_jitter=0.0,
        seed=0,
    )
    config.update(overrides)
    return Validated(QueueCore(**config))


@pytest.fixture
def core() -> Validated:
    return make_core()


def put(core, count: int, *, priority: int = 0, now: float = 0.0, not_before=None, payload=None):
    """Put ``count`` messages as one chunk; return their sequence numbers."""
    chunk = core.new_chunk(count, priority=priority, payload=payload)
    core.put(chunk, now=now, not_before=not_before)
    return list(range(chunk.base_seq, chunk.base_seq + count))


def seqs(lease) -> list[int]:
    return [s.chunk.base_seq + i for s in lease.spans for i in range(s.start, s.stop)]


def attempts(lease) -> list[int]:
    return [s.attempts for s in lease.spans for _ in range(s.start, s.stop)]


def drain(core, *, now: float) -> list[int]:
    """Lease and ack everything ready at ``now``; return the sequence numbers in order."""
    out = []
    while (lease := core.get_batch(1000, now=now)) is not None:
        out += seqs(lease)
        core.settle(lease.lease_id, done=lease.count, now=now)
    return out


def span_seqs(spans) -> list[int]:
    return [s.chunk.base_seq + i for s in spans for i in range(s.start, s.stop)]


def settle_acking(core, lease_id, **kwargs):
    """``core.settle(...)`` and the seqs its journal's ACK entries name, in order."""
    core.core.journal = []
    result = core.settle(lease_id, **kwargs)
    entries, core.core.journal = core.journal, None
    return result, span_seqs([e.span for e in entries if e.kind == Transition.ACK])


# -- put and get --------------------------------------------------------------------------------


def test_new_chunk_allocates_consecutive_sequence_numbers(core):
    a = core.new_chunk(3)
    b = core.new_chunk(2)
    assert (a.base_seq, a.count, b.base_seq, b.count) == (0, 3, 3, 2)
    assert core.next_seq == 5


def test_new_chunk_carries_priority_payload_and_meta(core):
    chunk = core.new_chunk(1, priority=7, payload=b"p", meta=[0, 1])
    assert (chunk.priority, chunk.payload, chunk.meta) == (7, b"p", [0, 1])


@pytest.mark.parametrize("count", [0, -1])
def test_new_chunk_rejects_an_empty_chunk(core, count):
    with pytest.raises(ValueError, match="at least one message"):
        core.new_chunk(count)
    assert core.next_seq == 0


def test_put_rejects_a_chunk_not_allocated_by_new_chunk(core):
    with pytest.raises(ValueError, match="not allocated"):
        core.put(Chunk(base_seq=0, count=3), now=0.0)
    assert core.stats().total_put == 0


def test_allocated_but_unput_chunk_is_not_delivered(core):
    core.new_chunk(3)
    assert core.get_batch(10, now=0.0) is None


def test_get_batch_on_an_empty_queue_returns_none(core):
    assert core.get_batch(10, now=0.0) is None
    assert core.stats().leased == 0


@pytest.mark.parametrize("max_items", [0, -1])
def test_get_batch_rejects_non_positive_max_items(core, max_items):
    put(core, 1)
    with pytest.raises(ValueError, match="max_items"):
        core.get_batch(max_items, now=0.0)
    assert core.stats().ready == 1


def test_messages_are_delivered_in_put_order(core):
    expected = put(core, 5)
    lease = core.get_batch(10, now=0.0)
    assert seqs(lease) == expected


def test_messages_of_several_puts_are_delivered_fifo(core):
    expected = put(core, 2) + put(core, 3) + put(core, 1)
    assert drain(core, now=0.0) == expected


def test_get_batch_returns_at_most_max_items(core):
    put(core, 10)
    lease = core.get_batch(4, now=0.0)
    assert lease.count == 4
    assert seqs(lease) == [0, 1, 2, 3]


def test_get_batch_returns_fewer_when_fewer_are_ready(core):
    put(core, 3)
    lease = core.get_batch(100, now=0.0)
    assert lease.count == 3
    assert core.get_batch(100, now=0.0) is None


def test_get_batch_splits_a_span_and_the_rest_is_delivered_next(core):
    put(core, 5)
    first = core.get_batch(2, now=0.0)
    second = core.get_batch(2, now=0.0)
    third = core.get_batch(2, now=0.0)
    assert (seqs(first), seqs(second), seqs(third)) == ([0, 1], [2, 3], [4])


def test_get_batch_takes_spans_from_several_chunks_into_one_lease(core):
    put(core, 2, payload="a")
    put(core, 2, payload="b")
    put(core, 2, payload="c")
    lease = core.get_batch(5, now=0.0)
    assert [s.chunk.payload for s in lease.spans] == ["a", "b", "c"]
    assert [(s.start, s.stop) for s in lease.spans] == [(0, 2), (0, 2), (0, 1)]
    assert lease.count == 5


def test_lease_spans_refer_to_the_chunk_that_was_put(core):
    chunk = core.new_chunk(3, payload=b"xyz", meta=(0, 1, 2, 3))
    core.put(chunk, now=0.0)
    lease = core.get_batch(3, now=0.0)
    assert [s.chunk for s in lease.spans] == [chunk]


def test_lease_deadline_is_now_plus_lease_timeout(core):
    put(core, 1)
    lease = core.get_batch(1, now=5.0)
    assert lease.deadline == 5.0 + LEASE_TIMEOUT_S


def test_each_lease_gets_a_new_id_and_can_be_looked_up(core):
    put(core, 2)
    a = core.get_batch(1, now=0.0)
    b = core.get_batch(1, now=0.0)
    assert a.lease_id != b.lease_id
    assert core.lease(a.lease_id) is a
    assert core.lease(b.lease_id) is b


def test_first_delivery_has_zero_attempts(core):
    put(core, 3)
    assert attempts(core.get_batch(3, now=0.0)) == [0, 0, 0]


def test_leased_message_is_not_delivered_again_while_leased(core):
    put(core, 2)
    core.get_batch(1, now=0.0)
    assert seqs(core.get_batch(5, now=0.0)) == [1]
    assert core.get_batch(5, now=0.0) is None


# -- priorities --------------------------------------------------------------------------------


def test_higher_priority_is_delivered_first(core):
    low = put(core, 2, priority=0)
    high = put(core, 2, priority=5)
    assert drain(core, now=0.0) == high + low


def test_messages_are_fifo_within_a_priority(core):
    a = put(core, 2, priority=3)
    b = put(core, 2, priority=3)
    c = put(core, 1, priority=3)
    assert drain(core, now=0.0) == a + b + c


def test_negative_priority_is_delivered_after_the_default(core):
    neg = put(core, 1, priority=-1)
    default = put(core, 1)
    assert drain(core, now=0.0) == default + neg


def test_one_batch_drains_priorities_from_highest_to_lowest(core):
    p1 = put(core, 2, priority=1)
    p3 = put(core, 2, priority=3)
    p2 = put(core, 2, priority=2)
    lease = core.get_batch(5, now=0.0)
    assert seqs(lease) == p3 + p2 + p1[:1]


def test_batch_that_ends_inside_a_priority_leaves_the_rest_of_it_first(core):
    low = put(core, 2, priority=0)
    high = put(core, 3, priority=9)
    core.get_batch(2, now=0.0)
    assert seqs(core.get_batch(10, now=0.0)) == high[2:] + low


def test_a_later_higher_priority_put_overtakes_waiting_messages(core):
    low = put(core, 3)
    core.get_batch(1, now=0.0)
    high = put(core, 1, priority=1)
    assert seqs(core.get_batch(10, now=0.0)) == high + low[1:]


# -- delayed put -------------------------------------------------------------------------------


def test_put_with_a_future_not_before_is_delayed(core):
    put(core, 3, now=0.0, not_before=5.0)
    s = core.stats()
    assert (s.ready, s.delayed) == (0, 3)


def test_delayed_message_is_not_delivered_before_not_before(core):
    put(core, 1, now=0.0, not_before=5.0)
    assert core.get_batch(1, now=4.999) is None


def test_delayed_message_is_delivered_at_not_before(core):
    expected = put(core, 2, now=0.0, not_before=5.0)
    assert seqs(core.get_batch(5, now=5.0)) == expected


@pytest.mark.parametrize("not_before", [0.0, -3.0])
def test_put_with_not_before_now_or_earlier_is_ready_at_once(core, not_before):
    put(core, 2, now=0.0, not_before=not_before)
    s = core.stats()
    assert (s.ready, s.delayed) == (2, 0)


def test_due_delayed_messages_queue_behind_messages_already_ready(core):
    delayed = put(core, 1, now=0.0, not_before=1.0)
    ready = put(core, 1, now=0.0)
    assert drain(core, now=2.0) == ready + delayed


def test_delayed_messages_become_ready_in_not_before_order(core):
    late = put(core, 1, now=0.0, not_before=3.0)
    early = put(core, 1, now=0.0, not_before=2.0)
    assert drain(core, now=5.0) == early + late


def test_delayed_messages_with_the_same_not_before_stay_in_put_order(core):
    a = put(core, 2, now=0.0, not_before=2.0)
    b = put(core, 2, now=0.0, not_before=2.0)
    assert drain(core, now=2.0) == a + b


def test_due_delayed_message_keeps_its_priority(core):
    low = put(core, 1, now=0.0)
    high = put(core, 1, priority=2, now=0.0, not_before=1.0)
    assert drain(core, now=1.0) == high + low


def test_has_ready_is_false_on_an_empty_queue(core):
    assert core.has_ready(0.0) is False


def test_has_ready_is_true_when_a_message_is_ready(core):
    put(core, 1)
    assert core.has_ready(0.0) is True


def test_has_ready_is_false_while_delayed_messages_are_not_due(core):
    put(core, 1, now=0.0, not_before=5.0)
    assert core.has_ready(4.0) is False
    assert core.stats().delayed == 1


def test_has_ready_promotes_due_messages(core):
    put(core, 2, now=0.0, not_before=5.0)
    assert core.has_ready(5.0) is True
    s = core.stats()
    assert (s.ready, s.delayed) == (2, 0)


def test_has_ready_is_false_while_every_message_is_leased(core):
    put(core, 1)
    core.get_batch(1, now=0.0)
    assert core.has_ready(0.0) is False


# -- settle: acks and releases -----------------------------------------------------------------


def test_settle_with_every_message_done_acks_them_all(core):
    put(core, 3)
    lease = core.get_batch(3, now=0.0)
    result = core.settle(lease.lease_id, done=3, now=1.0)
    assert (result.n_acked, result.n_retried, result.n_dead, result.n_released) == (3, 0, 0, 0)
    s = core.stats()
    assert (s.leased, s.total_acked, s.pending) == (0, 3, 0)


def test_settle_ends_the_lease(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.settle(lease.lease_id, done=1, now=0.0)
    assert core.lease(lease.lease_id) is None


def test_settle_journals_the_acked_spans_in_lease_order(core):
    a = put(core, 2)
    b = put(core, 2)
    lease = core.get_batch(4, now=0.0)
    _, acked = settle_acking(core, lease.lease_id, done=4, now=0.0)
    assert acked == a + b


def test_acked_messages_are_never_delivered_again(core):
    put(core, 3)
    lease = core.get_batch(3, now=0.0)
    core.settle(lease.lease_id, done=3, now=0.0)
    core.expire(now=1000.0)
    assert core.get_batch(10, now=1000.0) is None
    assert core.next_wakeup() is None


def test_settle_with_nothing_done_releases_every_message(core):
    expected = put(core, 3)
    lease = core.get_batch(3, now=0.0)
    result, acked = settle_acking(core, lease.lease_id, done=0, now=0.0)
    assert (result.n_acked, result.n_released, acked) == (0, 3, [])
    assert seqs(core.get_batch(10, now=0.0)) == expected


def test_partial_done_acks_the_messages_that_ran(core):
    put(core, 5)
    lease = core.get_batch(5, now=0.0)
    result, acked = settle_acking(core, lease.lease_id, done=2, now=0.0)
    assert (result.n_acked, result.n_released) == (2, 3)
    assert acked == [0, 1]
    assert core.stats().total_acked == 2


def test_partial_done_releases_the_rest_to_the_front_of_the_ready_queue(core):
    put(core, 4)
    waiting = put(core, 2)
    lease = core.get_batch(4, now=0.0)
    core.settle(lease.lease_id, done=1, now=0.0)
    assert drain(core, now=0.0) == [1, 2, 3] + waiting


def test_released_messages_keep_their_attempts(core):
    put(core, 1)
    core.settle(core.get_batch(1, now=0.0).lease_id, done=1, errors={0: b"e"}, now=0.0)
    retried = core.get_batch(1, now=BACKOFF_BASE_S)
    core.settle(retried.lease_id, done=0, now=BACKOFF_BASE_S)
    again = core.get_batch(1, now=BACKOFF_BASE_S)
    assert (attempts(retried), attempts(again)) == ([1], [1])


def test_released_messages_keep_their_order_across_spans(core):
    a = put(core, 2)
    b = put(core, 2)
    lease = core.get_batch(4, now=0.0)
    core.settle(lease.lease_id, done=1, now=0.0)
    assert seqs(core.get_batch(10, now=0.0)) == a[1:] + b


def test_released_messages_go_to_the_front_of_their_own_priority(core):
    high = put(core, 2, priority=5)
    low = put(core, 2, priority=0)
    lease = core.get_batch(4, now=0.0)
    later_low = put(core, 1, priority=0)
    core.settle(lease.lease_id, done=0, now=0.0)
    assert drain(core, now=0.0) == high + low + later_low


def test_released_messages_go_behind_a_higher_priority_put_meanwhile(core):
    low = put(core, 2)
    lease = core.get_batch(2, now=0.0)
    high = put(core, 1, priority=1)
    core.settle(lease.lease_id, done=0, now=0.0)
    assert drain(core, now=0.0) == high + low


# -- settle: errors, retries, dead letters -----------------------------------------------------


def test_failed_message_is_delayed_with_attempts_incremented(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    result = core.settle(lease.lease_id, done=1, errors={0: b"boom"}, now=0.0)
    assert (result.n_acked, result.n_retried, result.n_dead) == (0, 1, 0)
    s = core.stats()
    assert (s.delayed, s.ready, s.total_retried, s.total_acked) == (1, 0, 1, 0)


def test_nacked_message_is_redelivered_after_backoff(core):
    put(core, 1)
    lease = core.get_batch(1, now=10.0)
    core.settle(lease.lease_id, done=1, errors={0: b"boom"}, now=10.0)
    assert core.get_batch(1, now=10.0 + BACKOFF_BASE_S - 0.001) is None
    again = core.get_batch(1, now=10.0 + BACKOFF_BASE_S)
    assert (seqs(again), attempts(again)) == ([0], [1])


def test_other_messages_of_a_lease_with_a_failure_are_acked(core):
    put(core, 4)
    lease = core.get_batch(4, now=0.0)
    result, acked = settle_acking(core, lease.lease_id, done=4, errors={0: b"e", 2: b"e"}, now=0.0)
    assert (result.n_acked, result.n_retried) == (2, 2)
    assert acked == [1, 3]


def test_failures_before_a_partial_done_are_retried_and_the_rest_released(core):
    put(core, 5)
    lease = core.get_batch(5, now=0.0)
    result, acked = settle_acking(core, lease.lease_id, done=3, errors={1: b"e"}, now=0.0)
    assert (result.n_acked, result.n_retried, result.n_dead, result.n_released) == (2, 1, 0, 2)
    assert acked == [0, 2]
    assert seqs(core.get_batch(10, now=0.0)) == [3, 4]


def test_failures_in_several_spans_are_each_retried(core):
    put(core, 2)
    put(core, 2)
    lease = core.get_batch(4, now=0.0)
    core.settle(lease.lease_id, done=4, errors={1: b"e", 2: b"e"}, now=0.0)
    assert seqs(core.get_batch(10, now=BACKOFF_BASE_S)) == [1, 2]


def test_retry_delay_doubles_with_each_attempt(core):
    put(core, 1)
    now, waits = 0.0, []
    for _ in range(MAX_RETRIES):
        lease = core.get_batch(1, now=now)
        core.settle(lease.lease_id, done=1, errors={0: b"e"}, now=now)
        waits.append(core.next_wakeup() - now)
        now = core.next_wakeup()
    assert waits == [BACKOFF_BASE_S * 2**i for i in range(MAX_RETRIES)]


def test_retry_delay_is_capped_at_the_backoff_max():
    core = make_core(max_retries=10, retry_backoff_base_s=1.0, retry_backoff_max_s=3.0)
    put(core, 1)
    now, waits = 0.0, []
    for _ in range(4):
        lease = core.get_batch(1, now=now)
        core.settle(lease.lease_id, done=1, errors={0: b"e"}, now=now)
        waits.append(core.next_wakeup() - now)
        now = core.next_wakeup()
    assert waits == [1.0, 2.0, 3.0, 3.0]


def test_message_is_dead_lettered_after_max_retries_with_its_last_error(core):
    put(core, 1)
    now = 0.0
    for attempt in range(MAX_RETRIES + 1):
        lease = core.get_batch(1, now=now)
        result = core.settle(lease.lease_id, done=1, errors={0: b"err%d" % attempt}, now=now)
        now += BACKOFF_MAX_S
    assert result.n_dead == 1
    [dead] = core.dead
    assert (dead.seq, dead.attempts, dead.error) == (0, MAX_RETRIES + 1, b"err%d" % MAX_RETRIES)
    assert core.stats().pending == 0


def test_dead_lettered_message_is_never_delivered_again(core):
    put(core, 1)
    now = 0.0
    for _ in range(MAX_RETRIES + 1):
        lease = core.get_batch(1, now=now)
        core.settle(lease.lease_id, done=1, errors={0: b"e"}, now=now)
        now += BACKOFF_MAX_S
    assert core.get_batch(1, now=now + 1000.0) is None
    assert core.next_wakeup() is None


def test_max_retries_zero_dead_letters_on_the_first_failure():
    core = make_core(max_retries=0)
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    result = core.settle(lease.lease_id, done=1, errors={0: b"e"}, now=0.0)
    assert (result.n_retried, result.n_dead) == (0, 1)
    assert core.dead[0].attempts == 1


def test_fatal_error_dead_letters_at_once(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    result = core.settle(lease.lease_id, done=1, errors={0: b"fatal"}, fatal={0}, now=0.0)
    assert (result.n_retried, result.n_dead) == (0, 1)
    [dead] = core.dead
    assert (dead.seq, dead.attempts, dead.error) == (0, 1, b"fatal")


def test_fatal_applies_only_to_the_positions_it_lists(core):
    put(core, 3)
    lease = core.get_batch(3, now=0.0)
    result = core.settle(lease.lease_id, done=3, errors={0: b"a", 2: b"b"}, fatal={2}, now=0.0)
    assert (result.n_acked, result.n_retried, result.n_dead) == (1, 1, 1)
    assert [d.seq for d in core.dead] == [2]


def test_fatal_accepts_a_frozenset(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.settle(lease.lease_id, done=1, errors={0: b"e"}, fatal=frozenset({0}), now=0.0)
    assert len(core.dead) == 1


def test_dead_letter_records_its_chunk_and_index(core):
    put(core, 2)
    chunk = core.new_chunk(3, payload=b"abc")
    core.put(chunk, now=0.0)
    lease = core.get_batch(5, now=0.0)
    core.settle(lease.lease_id, done=5, errors={3: b"e"}, fatal={3}, now=0.0)
    [dead] = core.dead
    assert (dead.seq, dead.chunk, dead.index) == (chunk.base_seq + 1, chunk, 1)


def test_dead_letters_are_listed_in_lease_order(core):
    put(core, 4)
    lease = core.get_batch(4, now=0.0)
    errors = {3: b"d", 0: b"a", 2: b"c"}
    core.settle(lease.lease_id, done=4, errors=errors, fatal={0, 2, 3}, now=0.0)
    assert [(d.seq, d.error) for d in core.dead] == [(0, b"a"), (2, b"c"), (3, b"d")]


def test_empty_errors_dict_acks_like_no_errors(core):
    put(core, 2)
    lease = core.get_batch(2, now=0.0)
    assert core.settle(lease.lease_id, done=2, errors={}, now=0.0).n_acked == 2


# -- settle: bad calls change nothing ----------------------------------------------------------


def test_settle_of_an_unknown_lease_raises_key_error(core):
    put(core, 1)
    before = core.stats()
    with pytest.raises(KeyError):
        core.settle(12345, done=0, now=0.0)
    assert core.stats() == before


def test_settling_a_lease_twice_raises_key_error_and_changes_nothing(core):
    put(core, 3)
    lease = core.get_batch(3, now=0.0)
    core.settle(lease.lease_id, done=3, now=0.0)
    before = core.stats()
    with pytest.raises(KeyError):
        core.settle(lease.lease_id, done=3, errors={0: b"e"}, now=0.0)
    assert core.stats() == before
    assert core.dead == []


def test_settle_of_an_expired_lease_raises_key_error_and_changes_nothing(core):
    put(core, 2)
    lease = core.get_batch(2, now=0.0)
    core.expire(now=LEASE_TIMEOUT_S)
    before = core.stats()
    with pytest.raises(KeyError):
        core.settle(lease.lease_id, done=2, now=LEASE_TIMEOUT_S)
    assert core.stats() == before


@pytest.mark.parametrize("done", [-1, 4])
def test_settle_rejects_done_outside_the_lease_and_keeps_the_lease(core, done):
    put(core, 3)
    lease = core.get_batch(3, now=0.0)
    before = core.stats()
    with pytest.raises(ValueError, match="done"):
        core.settle(lease.lease_id, done=done, now=0.0)
    assert core.stats() == before
    assert core.lease(lease.lease_id) is lease
    assert core.settle(lease.lease_id, done=3, now=0.0).n_acked == 3


@pytest.mark.parametrize("position", [-1, 2, 3, 10])
def test_settle_rejects_error_positions_outside_the_messages_that_ran(core, position):
    put(core, 4)
    lease = core.get_batch(4, now=0.0)
    before = core.stats()
    with pytest.raises(ValueError, match="error positions"):
        core.settle(lease.lease_id, done=2, errors={position: b"e"}, now=0.0)
    assert core.stats() == before
    assert core.dead == []
    assert core.lease(lease.lease_id) is lease


def test_rejected_settle_keeps_the_lease_expirable(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    with pytest.raises(ValueError):
        core.settle(lease.lease_id, done=2, now=0.0)
    assert core.expire(now=LEASE_TIMEOUT_S) == 1


# -- lease expiry ------------------------------------------------------------------------------


def test_lease_is_not_expired_before_its_deadline(core):
    put(core, 2)
    lease = core.get_batch(2, now=0.0)
    assert core.expire(now=LEASE_TIMEOUT_S - 0.001) == 0
    assert core.lease(lease.lease_id) is lease


def test_lease_is_expired_at_exactly_its_deadline(core):
    put(core, 2)
    lease = core.get_batch(2, now=0.0)
    assert core.expire(now=lease.deadline) == 2
    assert core.lease(lease.lease_id) is None


def test_expire_returns_how_many_messages_it_took_back(core):
    put(core, 5)
    core.get_batch(2, now=0.0)
    core.get_batch(2, now=1.0)
    assert core.expire(now=100.0) == 4


def test_expire_takes_back_only_leases_that_are_due(core):
    put(core, 2)
    early = core.get_batch(1, now=0.0)
    late = core.get_batch(1, now=5.0)
    core.expire(now=LEASE_TIMEOUT_S)
    assert core.lease(early.lease_id) is None
    assert core.lease(late.lease_id) is late


def test_expired_lease_is_redelivered_after_backoff_with_attempts_incremented(core):
    put(core, 2)
    core.get_batch(2, now=0.0)
    core.expire(now=LEASE_TIMEOUT_S)
    assert core.get_batch(2, now=LEASE_TIMEOUT_S) is None
    again = core.get_batch(2, now=LEASE_TIMEOUT_S + BACKOFF_BASE_S)
    assert (seqs(again), attempts(again)) == ([0, 1], [1, 1])


def test_expiry_counts_total_expired_and_total_retried(core):
    put(core, 3)
    core.get_batch(3, now=0.0)
    core.expire(now=LEASE_TIMEOUT_S)
    s = core.stats()
    assert (s.total_expired, s.total_retried, s.delayed, s.leased) == (3, 3, 3, 0)


def test_repeatedly_expired_message_is_dead_lettered_with_lease_expired(core):
    put(core, 1)
    now = 0.0
    for _ in range(MAX_RETRIES + 1):
        assert core.get_batch(1, now=now) is not None
        now += LEASE_TIMEOUT_S
        core.expire(now=now)
        now += BACKOFF_MAX_S
    [dead] = core.dead
    assert (dead.seq, dead.attempts, dead.error) == (0, MAX_RETRIES + 1, LEASE_EXPIRED)
    assert core.stats().total_expired == MAX_RETRIES + 1


def test_expiry_keeps_the_attempts_of_each_span_of_a_lease(core):
    put(core, 1)
    core.settle(core.get_batch(1, now=0.0).lease_id, done=1, errors={0: b"e"}, now=0.0)
    put(core, 1, now=0.0)
    core.get_batch(5, now=BACKOFF_BASE_S)  # message 1 (fresh) then message 0 (1 attempt)
    core.expire(now=BACKOFF_BASE_S + LEASE_TIMEOUT_S)
    again = core.get_batch(5, now=100.0)
    assert sorted(zip(seqs(again), attempts(again))) == [(0, 2), (1, 1)]


def test_expire_ignores_settled_leases(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.settle(lease.lease_id, done=1, now=0.0)
    assert core.expire(now=1000.0) == 0
    assert core.stats().total_expired == 0


def test_expire_on_an_idle_queue_does_nothing(core):
    assert core.expire(now=1000.0) == 0


# -- extend ------------------------------------------------------------------------------------


def test_extend_keeps_a_lease_alive_past_its_original_deadline(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    assert core.extend([lease.lease_id], now=8.0) == []
    assert core.expire(now=LEASE_TIMEOUT_S + 1.0) == 0
    assert core.settle(lease.lease_id, done=1, now=LEASE_TIMEOUT_S + 1.0).n_acked == 1


def test_extend_moves_the_deadline_to_now_plus_lease_timeout(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.extend([lease.lease_id], now=8.0)
    assert core.lease(lease.lease_id).deadline == 8.0 + LEASE_TIMEOUT_S


def test_extended_lease_expires_at_its_new_deadline(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.extend([lease.lease_id], now=8.0)
    assert core.expire(now=8.0 + LEASE_TIMEOUT_S - 0.001) == 0
    assert core.expire(now=8.0 + LEASE_TIMEOUT_S) == 1


def test_extended_lease_is_expired_only_once(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.extend([lease.lease_id], now=3.0)
    core.extend([lease.lease_id], now=6.0)
    assert core.expire(now=1000.0) == 1
    assert core.stats().total_expired == 1


def test_extend_returns_the_ids_it_does_not_know(core):
    put(core, 3)
    settled = core.get_batch(1, now=0.0)
    core.settle(settled.lease_id, done=1, now=0.0)
    expired = core.get_batch(1, now=0.0)
    live = core.get_batch(1, now=5.0)
    core.expire(now=LEASE_TIMEOUT_S)
    ids = [settled.lease_id, live.lease_id, 999, expired.lease_id]
    assert core.extend(ids, now=LEASE_TIMEOUT_S) == [settled.lease_id, 999, expired.lease_id]


def test_extend_never_shortens_a_lease(core):
    put(core, 1)
    lease = core.get_batch(1, now=5.0)
    assert core.extend([lease.lease_id], now=1.0) == []
    assert lease.deadline == 5.0 + LEASE_TIMEOUT_S
    assert core.expire(now=1.0 + LEASE_TIMEOUT_S) == 0


def test_extend_of_no_ids_returns_no_ids(core):
    assert core.extend([], now=0.0) == []


# -- next_wakeup -------------------------------------------------------------------------------


def test_next_wakeup_is_none_on_an_empty_queue(core):
    assert core.next_wakeup() is None


def test_next_wakeup_is_none_when_messages_are_only_ready(core):
    put(core, 3)
    assert core.next_wakeup() is None


def test_next_wakeup_is_the_earliest_lease_deadline(core):
    put(core, 2)
    core.get_batch(1, now=3.0)
    core.get_batch(1, now=1.0)
    assert core.next_wakeup() == 1.0 + LEASE_TIMEOUT_S


def test_next_wakeup_is_the_earliest_delayed_message(core):
    put(core, 1, now=0.0, not_before=7.0)
    put(core, 1, now=0.0, not_before=4.0)
    assert core.next_wakeup() == 4.0


def test_next_wakeup_is_the_earlier_of_deadlines_and_delays(core):
    put(core, 1)
    core.get_batch(1, now=0.0)
    put(core, 1, now=0.0, not_before=LEASE_TIMEOUT_S + 1.0)
    assert core.next_wakeup() == LEASE_TIMEOUT_S
    put(core, 1, now=0.0, not_before=2.0)
    assert core.next_wakeup() == 2.0


def test_next_wakeup_ignores_settled_leases(core):
    put(core, 2)
    first = core.get_batch(1, now=0.0)
    core.get_batch(1, now=5.0)
    core.settle(first.lease_id, done=1, now=0.0)
    assert core.next_wakeup() == 5.0 + LEASE_TIMEOUT_S


def test_next_wakeup_follows_an_extended_lease(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.extend([lease.lease_id], now=4.0)
    assert core.next_wakeup() == 4.0 + LEASE_TIMEOUT_S


def test_next_wakeup_is_none_after_every_lease_is_settled(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.extend([lease.lease_id], now=1.0)
    core.settle(lease.lease_id, done=1, now=1.0)
    assert core.next_wakeup() is None


def test_next_wakeup_includes_a_pending_retry(core):
    put(core, 1)
    lease = core.get_batch(1, now=2.0)
    core.settle(lease.lease_id, done=1, errors={0: b"e"}, now=2.0)
    assert core.next_wakeup() == 2.0 + BACKOFF_BASE_S


# -- stats -------------------------------------------------------------------------------------


def test_stats_of_a_new_queue_are_all_zero(core):
    s = core.stats()
    assert (s.ready, s.delayed, s.leased, s.dead, s.pending) == (0, 0, 0, 0, 0)
    assert (s.total_put, s.total_acked, s.total_retried, s.total_expired) == (0, 0, 0, 0)


def test_stats_count_messages_in_each_state(core):
    put(core, 10)
    put(core, 4, now=0.0, not_before=5.0)
    core.get_batch(3, now=0.0)
    core.get_batch(2, now=0.0)
    s = core.stats()
    assert (s.ready, s.delayed, s.leased, s.pending) == (5, 4, 5, 14)


def test_stats_count_lifetime_totals(core):
    put(core, 6)
    lease = core.get_batch(4, now=0.0)
    core.settle(lease.lease_id, done=3, errors={0: b"e", 1: b"f"}, fatal={1}, now=0.0)
    core.get_batch(2, now=0.0)
    core.expire(now=LEASE_TIMEOUT_S)
    s = core.stats()
    assert (s.total_put, s.total_acked, s.total_retried, s.total_expired) == (6, 1, 3, 2)
    assert (s.dead, s.delayed, s.ready, s.leased) == (1, 3, 1, 0)


def test_stats_are_a_frozen_snapshot(core):
    s = core.stats()
    put(core, 1)
    assert s.ready == 0
    with pytest.raises(AttributeError):
        s.ready = 5


# -- journal -----------------------------------------------------------------------------------


def journal_of(core) -> list[tuple]:
    """The journal so far as ``(kind, first seq, count, attempts)`` plus the time of a RETRY
    or the error of a DEAD; then clear it."""
    entries, core.core.journal = core.journal, []
    out = []
    for e in entries:
        extra = {Transition.RETRY: (e.time,), Transition.DEAD: (e.error,)}.get(e.kind, ())
        out.append((e.kind, e.span.first_seq, e.span.count, e.span.attempts, *extra))
    return out


def test_journal_is_off_by_default(core):
    put(core, 1)
    core.settle(core.get_batch(1, now=0.0).lease_id, done=1, now=0.0)
    assert core.journal is None


def test_journal_records_each_leased_span(core):
    core.core.journal = []
    put(core, 2)
    put(core, 3)
    core.get_batch(4, now=0.0)
    assert journal_of(core) == [(Transition.LEASE, 0, 2, 0), (Transition.LEASE, 2, 2, 0)]


def test_journal_records_the_releases_and_acks_of_a_settle(core):
    put(core, 4)
    lease = core.get_batch(4, now=0.0)
    core.core.journal = []
    core.settle(lease.lease_id, done=2, now=0.0)
    assert journal_of(core) == [(Transition.RELEASE, 2, 2, 0), (Transition.ACK, 0, 2, 0)]


def test_journal_records_a_retry_with_its_new_attempts_and_due_time(core):
    put(core, 1)
    lease = core.get_batch(1, now=3.0)
    core.core.journal = []
    core.settle(lease.lease_id, done=1, errors={0: b"e"}, now=3.0)
    assert journal_of(core) == [(Transition.RETRY, 0, 1, 1, 3.0 + BACKOFF_BASE_S)]


def test_journal_records_a_dead_letter_with_its_error(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.core.journal = []
    core.settle(lease.lease_id, done=1, errors={0: b"bad"}, fatal={0}, now=0.0)
    assert journal_of(core) == [(Transition.DEAD, 0, 1, 1, b"bad")]


def test_journal_records_an_expired_lease_as_retries(core):
    put(core, 2)
    core.get_batch(2, now=0.0)
    core.core.journal = []
    core.expire(now=LEASE_TIMEOUT_S)
    assert journal_of(core) == [(Transition.RETRY, 0, 2, 1, LEASE_TIMEOUT_S + BACKOFF_BASE_S)]


def test_journal_records_nothing_for_a_rejected_settle(core):
    put(core, 1)
    lease = core.get_batch(1, now=0.0)
    core.core.journal = []
    with pytest.raises(ValueError):
        core.settle(lease.lease_id, done=2, now=0.0)
    assert journal_of(core) == []


# -- restore (a durable queue reopening) ---------------------------------------------------------


def test_restore_brings_back_ready_spans_with_their_attempts(core):
    chunk = Chunk(base_seq=10, count=5, payload=b"p")
    core.restore(chunk, [(0, 2, 1), (4, 5, 0)], now=0.0)
    lease = core.get_batch(10, now=0.0)
    assert list(zip(seqs(lease), attempts(lease))) == [(10, 1), (11, 1), (14, 0)]
    assert lease.spans[0].chunk is chunk


def test_restore_with_a_future_not_before_delays_the_spans(core):
    core.restore(Chunk(base_seq=0, count=2), [(0, 2, 0)], now=0.0, not_before=5.0)
    assert core.stats().delayed == 2
    assert core.get_batch(2, now=4.0) is None
    assert core.get_batch(2, now=5.0).count == 2


def test_restore_counts_the_restored_messages_as_put(core):
    core.restore(Chunk(base_seq=0, count=9), [(1, 4, 0)], now=0.0)
    s = core.stats()
    assert (s.total_put, s.ready) == (3, 3)


def test_restore_moves_next_seq_past_the_chunk(core):
    core.restore(Chunk(base_seq=20, count=5), [(0, 1, 0)], now=0.0)
    assert core.next_seq == 25
    assert core.new_chunk(1).base_seq == 25


def test_restore_with_no_spans_only_reserves_the_sequence_numbers(core):
    core.restore(Chunk(base_seq=0, count=4), [], now=0.0)
    assert core.next_seq == 4
    assert core.stats().total_put == 0


def test_restore_dead_brings_back_a_dead_letter(core):
    core.restore_dead(7, 3, b"err", meta="m")
    [dead] = core.dead
    assert (dead.seq, dead.attempts, dead.error) == (7, 3, b"err")
    assert (dead.index, dead.chunk.meta) == (0, "m")
    assert (core.next_seq, core.stats().dead, core.stats().total_put) == (8, 1, 1)


def test_advance_seq_never_moves_next_seq_backwards(core):
    core.advance_seq(10)
    core.advance_seq(4)
    assert core.next_seq == 10


def test_live_spans_lists_every_unsettled_span_with_its_state(core):
    put(core, 2)
    put(core, 1, now=0.0, not_before=9.0)
    put(core, 3, priority=1)
    core.get_batch(2, now=0.0)
    acked = core.get_batch(1, now=0.0)
    core.settle(acked.lease_id, done=1, now=0.0)
    live = [(s.first_seq, s.count, state) for s, state in core.live_spans()]
    assert live == [(0, 2, "ready"), (2, 1, "delayed"), (3, 2, "leased")]


# -- constructor -------------------------------------------------------------------------------


@pytest.mark.parametrize("lease_timeout_s", [0.0, -1.0, math.nan])
def test_constructor_rejects_a_non_positive_lease_timeout(lease_timeout_s):
    with pytest.raises(ValueError, match="lease_timeout_s"):
        QueueCore(lease_timeout_s=lease_timeout_s, max_retries=1)


def test_constructor_rejects_negative_max_retries():
    with pytest.raises(ValueError, match="max_retries"):
        QueueCore(lease_timeout_s=1.0, max_retries=-1)


def test_constructor_keeps_its_settings():
    core = QueueCore(lease_timeout_s=2.5, max_retries=0)
    assert (core.lease_timeout_s, core.max_retries, core.next_seq, core.dead) == (2.5, 0, 0, [])


@pytest.mark.parametrize("jitter", [-0.5, 1.5])
def test_constructor_rejects_a_backoff_jitter_outside_the_unit_interval(jitter):
    with pytest.raises(ValueError, match="jitter"):
        QueueCore(lease_timeout_s=1.0, max_retries=1, retry_backoff_jitter=jitter)


def test_putting_the_same_chunk_twice_is_rejected():  # found by this suite, now fixed
    core = QueueCore(lease_timeout_s=1.0, max_retries=1)
    chunk = core.new_chunk(2)
    core.put(chunk, now=0.0)
    with pytest.raises(ValueError):
        core.put(chunk, now=0.0)
    core.validate()


def test_same_seed_gives_the_same_jittered_retry_delays():
    def retry_times(seed):
        core = make_core(retry_backoff_jitter=1.0, seed=seed, max_retries=5)
        put(core, 3)
        lease = core.get_batch(3, now=0.0)
        core.settle(lease.lease_id, done=3, errors={0: b"e", 1: b"e", 2: b"e"}, now=0.0)
        times = []
        while (t := core.next_wakeup()) is not None:
            times.append(t)
            core.settle(core.get_batch(1, now=t).lease_id, done=1, now=t)
        return times

    assert retry_times(7) == retry_times(7)
    assert retry_times(7) != retry_times(8)


def test_jittered_retry_delay_stays_between_half_and_full_backoff():
    core = make_core(retry_backoff_jitter=0.5, seed=3)
    put(core, 50)
    lease = core.get_batch(50, now=0.0)
    core.settle(lease.lease_id, done=50, errors={i: b"e" for i in range(50)}, now=0.0)
    assert core.get_batch(50, now=BACKOFF_BASE_S * 0.5 - 0.001) is None
    assert core.get_batch(50, now=BACKOFF_BASE_S).count == 50


def test_fatal_positions_without_an_error_are_rejected_and_the_lease_kept():
    core = QueueCore(lease_timeout_s=1.0, max_retries=1)
    core.put(core.new_chunk(2), now=0.0)
    lease = core.get_batch(2, now=0.0)
    with pytest.raises(ValueError, match="fatal"):
        core.settle(lease.lease_id, done=2, errors={0: b"e"}, fatal={1}, now=0.0)
    assert core.lease(lease.lease_id) is lease
    core.validate()


@pytest.mark.parametrize("field", ["retry_backoff_base_s", "retry_backoff_max_s"])
def test_negative_backoff_is_rejected(field):
    with pytest.raises(ValueError, match="backoff"):
        QueueCore(lease_timeout_s=1.0, max_retries=1, **{field: -1.0})
