"""The queue actor contract, on a real cluster. Parametrized over every queue kind."""

from __future__ import annotations

import pickle
import time

import pytest

from daskqueue import DurableQueue, LeaseExpiredError, QueueClosedError, QueueEmpty, TransientQueue
from daskqueue.messages import Kind
from daskqueue.serialize import Group, decode_delivery, encode_put, encode_settle, pack_payloads
from tests.helpers import wait_until

QUEUE_KINDS = [TransientQueue, DurableQueue]


@pytest.fixture(params=QUEUE_KINDS, ids=lambda k: k.kind)
def make_queue(request, client, tmp_path):
    made = []

    def make(**kwargs):
        args = (0,) if request.param is TransientQueue else (0, str(tmp_path / f"q{len(made)}"))
        future = client.submit(request.param, *args, actor=True, pure=False, **kwargs)
        queue = future.result()
        made.append((future, queue))
        return queue

    yield make
    for _, queue in made:
        try:
            queue.close().result()
        except Exception:
            pass


def put(queue, items, token=None, **group):
    offsets, data = pack_payloads(items, max_message_bytes=2**20)
    g = Group(Kind.RAW, None, group.get("type"), group.get("priority", 0), None,
              group.get("delay_s", 0.0), len(items), offsets, data)
    return queue.put_batch(encode_put([g], {}), token).result()


def get(queue, n=100, wait_s=0.0):
    blob = queue.get_batch(n, wait_s).result()
    if blob is None:
        return None, []
    lease_id, _, segments = decode_delivery(blob)
    items = [(s.first_seq + j, pickle.loads(p), s.attempts)
             for s in segments for j, p in enumerate(s.payloads())]
    return lease_id, items


def wait_until_waiting(queue, calls):
    """Until ``calls`` get_batch calls reached the queue: a call counts itself and then, with
    nothing ready, waits without yielding the loop in between, so the next call the queue
    answers (this ``stats``) comes after it waits."""
    wait_until(lambda: queue.stats().result().get_calls >= calls, timeout_s=10)


def ack(queue, lease_id, n, errors=None):
    return queue.settle(lease_id, encode_settle(n, errors or {}, set(), pickle.dumps([None] * n))).result()


def test_put_then_get_returns_items_in_order_with_sequence_numbers(make_queue):
    q = make_queue()
    assert put(q, ["a", "b", "c"]) == [(0, 3)]
    lease, items = get(q, 2)
    assert items == [(0, "a", 0), (1, "b", 0)]
    _, rest = get(q, 10)
    assert rest == [(2, "c", 0)]


def test_higher_priority_is_delivered_first(make_queue):
    q = make_queue()
    put(q, ["low"], priority=0)
    put(q, ["high"], priority=9)
    assert [x for _, x, _ in get(q)[1]] == ["high", "low"]


def test_ack_settles_and_stats_count_it(make_queue):
    q = make_queue()
    put(q, list(range(10)))
    lease, items = get(q, 10)
    assert ack(q, lease, 10) == (10, 0, 0, 0)
    s = q.stats().result()
    assert (s.ready, s.leased, s.total_acked, s.pending) == (0, 0, 10, 0)


def test_get_batch_nowait_on_empty_queue_raises_queue_empty(make_queue):
    q = make_queue()
    with pytest.raises(QueueEmpty):
        q.get_batch_nowait(5).result()


def test_long_poll_returns_as_soon_as_a_put_arrives(make_queue):
    q = make_queue()
    started = time.monotonic()
    waiting = q.get_batch(5, 10.0)
    wait_until_waiting(q, calls=1)
    put(q, ["x"])
    blob = waiting.result(timeout=5)
    assert blob is not None and time.monotonic() - started < 3


def test_long_poll_on_empty_queue_times_out_with_none(make_queue):
    q = make_queue()
    started = time.monotonic()
    assert q.get_batch(5, 0.3).result() is None
    assert 0.25 < time.monotonic() - started < 3


def test_unacked_lease_expires_and_messages_are_redelivered_with_attempts(make_queue):
    q = make_queue(lease_timeout_s=0.3, retry_backoff_base_s=0.0)
    put(q, ["a", "b"])
    lease, items = get(q)
    assert [a for _, _, a in items] == [0, 0]
    _, again = get(q, wait_s=3.0)
    assert [(seq, x, a) for seq, x, a in again] == [(0, "a", 1), (1, "b", 1)]
    s = q.stats().result()
    assert s.total_expired == 2


def test_late_ack_of_an_expired_lease_is_refused_cleanly(make_queue):
    q = make_queue(lease_timeout_s=0.3, retry_backoff_base_s=0.0)
    put(q, ["a"])
    stale, _ = get(q)
    fresh, items = get(q, wait_s=3.0)
    with pytest.raises(LeaseExpiredError) as info:
        ack(q, stale, 1)
    assert info.value.lease_id == stale
    assert ack(q, fresh, 1) == (1, 0, 0, 0)  # the redelivery settles normally
    assert q.stats().result().total_acked == 1


def test_extending_a_lease_keeps_it(make_queue):
    q = make_queue(lease_timeout_s=0.5, retry_backoff_base_s=60.0)
    put(q, ["a", "b"])
    lease, _ = get(q, 1)
    witness, _ = get(q, 1)  # leased at the same time, never extended
    # Extend until the witness lease expired: the extended one outlived its timeout.
    wait_until(lambda: q.extend([lease]).result() == [] and q.stats().result().total_expired == 1, timeout_s=10)
    assert q.extend([lease]).result() == []
    assert ack(q, lease, 1) == (1, 0, 0, 0)
    assert q.extend([lease]).result() == [lease]


def test_failed_message_is_retried_after_backoff_then_dead(make_queue):
    # A backoff of 0.5-1 s (jitter 0.5): the get right after the ack finds it still in backoff
    # however loaded the machine (at 0.1-0.2 s a slow round trip found it retried already).
    q = make_queue(max_retries=1, retry_backoff_base_s=1.0)
    put(q, ["a"])
    lease, _ = get(q)
    assert ack(q, lease, 1, errors={0: b"E\x00first\x00tb"}) == (0, 1, 0, 0)
    assert get(q)[1] == []  # in backoff
    lease, items = get(q, wait_s=10.0)
    assert items[0][2] == 1
    assert ack(q, lease, 1, errors={0: b"E\x00second\x00tb"}) == (0, 0, 1, 0)
    _, dead = q.fetch_dead(0).result()
    assert [(seq, attempts, err) for seq, attempts, err, _ in dead] == [(0, 2, b"E\x00second\x00tb")]


def test_delayed_put_is_not_delivered_before_its_time(make_queue):
    q = make_queue()
    put(q, ["later"], delay_s=0.5)
    assert get(q)[1] == []
    _, items = get(q, wait_s=3.0)
    assert [x for _, x, _ in items] == ["later"]


def test_close_wakes_waiters_and_refuses_calls(make_queue):
    q = make_queue()
    waiting = q.get_batch(5, 30.0)
    wait_until_waiting(q, calls=1)
    q.close().result()
    assert waiting.result(timeout=5) is None
    with pytest.raises(QueueClosedError):
        put(q, ["x"])


def test_leases_of_a_lost_worker_come_back_at_once_with_an_attempt(make_queue):
    q = make_queue(retry_backoff_base_s=0.0, max_retries=1)
    put(q, ["a", "b", "c"])
    lost_lease = q.get_batch(2, 0.0, "tcp://lost:1").result()
    kept_lease, kept = get(q, 1)
    assert q.workers_lost(["tcp://lost:1"]).result() == 2
    assert q.workers_lost(["tcp://lost:1"]).result() == 0  # nothing left to take back
    assert lost_lease is not None and kept_lease is not None
    _, again = get(q, 10, wait_s=2.0)
    assert [(item, attempts) for _, item, attempts in again] == [("a", 1), ("b", 1)]
    stats = q.stats().result()
    assert (stats.total_worker_lost, stats.total_expired, stats.leased) == (2, 0, 3)


def test_a_message_whose_worker_dies_every_time_is_dead_lettered_as_killed(make_queue):
    q = make_queue(retry_backoff_base_s=0.0, max_retries=1)
    put(q, ["x"])
    for _ in range(2):
        assert q.get_batch(1, 2.0, "tcp://w:1").result() is not None
        assert q.workers_lost(["tcp://w:1"]).result() == 1
    _, dead = q.fetch_dead(0).result()
    ((seq, attempts, error, _),) = dead
    assert (seq, attempts) == (0, 2)
    assert error.startswith(b"daskqueue.errors.KilledWorkerError\x00the worker running this message died")
