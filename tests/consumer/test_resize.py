"""Queues added to and removed from a running pool: keyed messages move with their keys, in
order, nothing is lost, results keep their ids; transient and durable."""

from __future__ import annotations

import threading
import time

import pytest

from daskqueue.errors import ConfigurationError
from daskqueue.messages import split_id
from tests import tasks
from tests.consumer.test_scheduling import max_overlap
from tests.helpers import wait_until


#: How long a fenced key's next message is long-polled for once its fence is due to lift: a
#: poll woken when it lifts returns in a fraction of a second; one that is not, at the end.
FENCED_POLL_S = 20.0

def check_key_order(ids, keys, results):
    """Every task ran once, and each key's tasks one at a time, in input order."""
    assert set(results) >= set(ids), f"{len(set(ids) - set(results))} tasks have no result"
    by_key: dict[str, list] = {}
    for position, (task_id, k) in enumerate(zip(ids, keys)):
        (_, i), start, end = results[task_id]
        assert i == position
        by_key.setdefault(k, []).append((i, start, end))
    spans = []
    for k, runs in by_key.items():
        runs.sort()
        for (_, _, end), (_, start, _) in zip(runs, runs[1:]):
            assert start >= end, f"key {k}: a message started before the previous one ended"
        spans += [(s, e) for _, s, e in runs]
    assert max_overlap(spans) > 1  # different keys did run at once


def _leased_and_waiting(stats, *, leased, waiting):
    """Whether the queues in ``stats`` have at least ``leased`` messages running and
    ``waiting`` not yet delivered: the pool is under load."""
    return sum(s.leased for s in stats) >= leased and sum(s.ready + s.delayed for s in stats) >= waiting


def keyed_tasks(keys, first=0, seconds=0.004):
    return [(tasks.timed_sleep, (k, first + i), seconds) for i, k in enumerate(keys)]


@pytest.mark.timeout(180)
def test_add_queues_under_load_moves_keys_in_order_and_loses_nothing(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=4, max_concurrency=2)
    cp.start()
    keys = [f"device-{i % 24}" for i in range(1200)]
    ids = qp.batch_submit(keyed_tasks(keys[:600], seconds=0.02), keys=keys[:600])
    # Running: some keys hold a message, most have more waiting.
    wait_until(lambda: _leased_and_waiting(qp.stats(), leased=1, waiting=300), timeout_s=30)
    assert qp.add_queues(1) == [2]
    assert qp.n_queues == 3 and qp.queue_indices == [0, 1, 2]
    ids += qp.batch_submit(keyed_tasks(keys[600:], first=600), keys=keys[600:])
    cp.join(timeout=150)
    results = cp.results()
    check_key_order(ids, keys, results)
    assert len(results) == 1200
    stats = {s.index: s for s in qp.stats()}
    assert stats[2].total_put > 0  # the new queue took over keys (moved and new messages)
    later_queues = {split_id(i)[0] for i in ids[600:]}
    assert 2 in later_queues


@pytest.mark.timeout(180)
def test_remove_queue_under_load_drains_it_into_the_others(pools):
    qp = pools.queue(3)
    cp = pools.consumer(qp, n_consumers=3, max_concurrency=2)
    cp.start()
    keys = [f"user-{i % 18}" for i in range(900)]
    ids = qp.batch_submit(keyed_tasks(keys), keys=keys)
    plain = qp.batch_submit([(tasks.timed_sleep, ("plain", i), 0.002) for i in range(300)])
    # Running: queue 1 has messages leased to consumers and more waiting to move.
    wait_until(lambda: _leased_and_waiting([s for s in qp.stats() if s.index == 1], leased=1, waiting=50),
               timeout_s=30)
    moved = qp.remove_queue(1, timeout_s=120)
    assert moved > 0
    assert qp.n_queues == 2 and qp.queue_indices == [0, 2]
    after = qp.batch_submit([(tasks.double, i) for i in range(60)])
    assert {split_id(i)[0] for i in after} == {0, 2}
    cp.join(timeout=150)
    results = cp.results()
    check_key_order(ids, keys, results)
    assert sorted(results[i][0][1] for i in plain) == list(range(300))
    assert [results[i] for i in after] == [2 * i for i in range(60)]
    assert qp.result(ids[0]) == results[ids[0]]
    with pytest.raises(ConfigurationError, match="no queue 1"):
        qp.remove_queue(1)


def test_the_last_queue_cannot_be_removed_and_k_is_checked(pools):
    qp = pools.queue(1)
    with pytest.raises(ConfigurationError, match="last queue"):
        qp.remove_queue(0)
    with pytest.raises(ConfigurationError, match="k"):
        qp.add_queues(0)


@pytest.mark.timeout(180)
def test_durable_add_and_remove_survive_a_reopen(client, tmp_path):
    from daskqueue import ConsumerPool, QueuePool

    keys = [f"file-{i % 40}" for i in range(400)]
    qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "pool")
    ids = qp.batch_submit([(tasks.double, i) for i in range(400)], keys=keys)
    assert qp.add_queues(1) == [2]
    moved = qp.remove_queue(0, timeout_s=60)
    assert moved > 0
    pending = {s.index: s.pending for s in qp.stats()}
    assert set(pending) == {1, 2} and sum(pending.values()) == 400
    qp.close()
    reopened = QueuePool(client, 3, durability="durable", dirpath=tmp_path / "pool")
    try:
        assert reopened.queue_indices == [1, 2]
        assert sum(s.pending for s in reopened.stats()) == 400
        cp = ConsumerPool(client, reopened, n_consumers=2)
        cp.start()
        cp.join(timeout=120)
        assert sorted(cp.results().values()) == sorted(2 * i for i in range(400))
        cp.close()
    finally:
        reopened.close()
    assert len(ids) == 400


@pytest.mark.timeout(120)
def test_a_typed_pool_moves_types_with_the_ring(pools):
    qp = pools.queue(1, scheduler="capped", type_caps={"bulk": 1})
    types = [f"t{i}" for i in range(12)]
    ids = []
    for t in types:
        ids += qp.batch_submit([(tasks.double, i) for i in range(10)], type=t)
    qp.add_queues(2)
    stats = qp.stats()
    assert sum(s.pending for s in stats) == 120
    assert sum(1 for s in stats if s.pending) > 1  # some types moved to the new queues
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    cp.join(timeout=60)
    results = cp.results()
    assert sorted(results[i] for i in ids) == sorted(2 * i for i in range(10) for _ in types)


@pytest.mark.timeout(60)
def test_a_moved_key_waits_at_its_new_queue_until_its_running_message_settles(pools):
    """Key "b" goes to queue 1 once it exists. Its first message runs (leased by hand) at
    queue 0 when the queue is added: the second moves, and queue 1 holds it until the
    first is settled at queue 0; its result still comes back under its own id."""
    from daskqueue.serialize import decode_delivery, dumps, encode_settle

    qp = pools.queue(1)
    ids = qp.put_many(["first", "second"], keys=["b", "b"])
    blob = qp.queues[0].get_batch(10, 0.0, None).result(timeout=10)
    lease_id, _, segments = decode_delivery(blob)
    assert sum(s.count for s in segments) == 1  # one message of a key at a time
    qp.add_queues(1)
    new = qp.queues[1]
    assert new.stats().result(timeout=10).ready == 1
    assert new.get_batch(10, 0.5, None).result(timeout=10) is None  # fenced
    qp.queues[0].settle(lease_id, encode_settle(1, {}, set(), dumps(["one"]))).result(timeout=10)
    started = time.monotonic()
    blob = new.get_batch(10, FENCED_POLL_S, None).result(timeout=FENCED_POLL_S + 10)
    # Woken when the fence lifts (checked every 0.1 s), not at the end of its wait.
    assert blob is not None and time.monotonic() - started < FENCED_POLL_S / 4
    lease_id, _, segments = decode_delivery(blob)
    new.settle(lease_id, encode_settle(1, {}, set(), dumps(["two"]))).result(timeout=10)
    assert qp.result(ids[0], timeout_s=10) == "one"
    assert qp.result(ids[1], timeout_s=10) == "two"  # under the id put_many returned
