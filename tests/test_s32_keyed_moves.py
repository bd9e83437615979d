"""A key whose one message runs in its old queue when ``add_queues`` moves the key: nothing of
it moves, yet its next put goes to the new queue, which must hold it until the running one
ends (the new queue fences the key, asking the old one). Real actors on the shared cluster."""

from __future__ import annotations

import time

import pytest

from daskqueue.messages import split_id
from daskqueue.queue.ring import HashRing
from daskqueue.serialize import decode_delivery, dumps, encode_settle
from tests import tasks


#: How long a fenced key's next message is long-polled for once its fence is due to lift: a
#: poll woken when it lifts returns in a fraction of a second; one that is not, at the end.
FENCED_POLL_S = 20.0

def _lease_by_hand(queue):
    """Lease the one ready message of ``queue`` (as a consumer would); its lease id."""
    lease_id, _, segments = decode_delivery(queue.get_batch(10, 0.0, None).result(timeout=10))
    assert sum(s.count for s in segments) == 1
    return lease_id


def _settle_one(queue, lease_id, value):
    queue.settle(lease_id, encode_settle(1, {}, set(), dumps([value]))).result(timeout=10)


def _waits_then_runs(qp, queue_index, settle_first):
    """The new queue ``queue_index`` delivers nothing while the first message runs, and the
    second message soon after the first is settled."""
    new = qp.queues[queue_index]
    assert new.stats().result(timeout=10).ready == 1
    assert new.get_batch(10, 0.5, None).result(timeout=10) is None  # fenced: the first still runs
    settle_first()
    started = time.monotonic()
    blob = new.get_batch(10, FENCED_POLL_S, None).result(timeout=FENCED_POLL_S + 10)
    # Woken when the fence lifts (checked every 0.1 s), not at the end of its wait.
    assert blob is not None and time.monotonic() - started < FENCED_POLL_S / 4
    lease_id, _, _ = decode_delivery(blob)
    _settle_one(new, lease_id, "two")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("durability", ["transient", "durable"])
def test_a_key_whose_only_message_runs_at_the_move_waits_at_its_new_queue(pools, tmp_path, durability):
    assert (HashRing([0]).node("b"), HashRing([0, 1]).node("b")) == (0, 1)
    extra = {"durability": "durable", "dirpath": tmp_path / "pool"} if durability == "durable" else {}
    qp = pools.queue(1, **extra)
    first = qp.put_many(["first"], keys=["b"])
    lease_id = _lease_by_hand(qp.queues[0])  # runs at queue 0, nothing of "b" waits there
    qp.add_queues(1)
    second = qp.put_many(["second"], keys=["b"])
    assert split_id(second[0])[0] == 1  # "b"'s new queue
    _waits_then_runs(qp, 1, lambda: _settle_one(qp.queues[0], lease_id, "one"))
    assert qp.result(first[0], timeout_s=10) == "one"
    assert qp.result(second[0], timeout_s=10) == "two"


@pytest.mark.timeout(60)
def test_a_key_fenced_with_no_message_of_it_keeps_its_fence_when_it_moves_on(pools):
    """Key "e" goes 0 -> 1 -> 2 over two ``add_queues`` while its first message runs at
    queue 0 all along: queue 2 holds its next message too."""
    assert [HashRing(list(range(n))).node("e") for n in (1, 2, 3)] == [0, 1, 2]
    qp = pools.queue(1)
    first = qp.put_many(["first"], keys=["e"])
    lease_id = _lease_by_hand(qp.queues[0])
    qp.add_queues(1)
    qp.add_queues(1)
    second = qp.put_many(["second"], keys=["e"])
    assert split_id(second[0])[0] == 2
    _waits_then_runs(qp, 2, lambda: _settle_one(qp.queues[0], lease_id, "one"))
    assert qp.result(first[0], timeout_s=10) == "one"


@pytest.mark.timeout(90)
def test_a_running_keyed_task_and_the_next_of_its_key_across_add_queues(pools):
    """Consumers, real tasks: the key's second task starts only once its first one ended,
    though the first ran at queue 0 when the key moved to queue 1."""
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=2, max_concurrency=1)
    cp.start()
    (first,) = qp.batch_submit([(tasks.timed_sleep, "first", 2.0)], keys=["b"])
    deadline = time.monotonic() + 30
    while qp.stats()[0].leased < 1:
        assert time.monotonic() < deadline, "the first task never started"
        time.sleep(0.02)
    qp.add_queues(1)
    (second,) = qp.batch_submit([(tasks.timed_sleep, "second", 0.0)], keys=["b"])
    assert split_id(second)[0] == 1
    _, _, first_end = qp.result(first, timeout_s=30)
    _, second_start, _ = qp.result(second, timeout_s=30)
    assert second_start >= first_end, "the key's second task started while its first one ran"
