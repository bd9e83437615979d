"""Dead letters you can act on: list them with their payload and error, replay them (their
outcomes come back under their old ids), purge them; a durable pool keeps all of it across a
restart; a dead letter keeps its own payload, not its whole put batch."""

from __future__ import annotations

import datetime

import pytest

from daskqueue import DeadLetter
from daskqueue.errors import RemoteTaskError
from tests import tasks


def fail_first_run(x, marker_dir):
    """Fail while ``marker_dir/<x>`` does not exist (the test creates it to let it pass)."""
    import os

    if not os.path.exists(os.path.join(marker_dir, str(x))):
        raise ValueError(f"not yet: {x}")
    return x * 10


@pytest.mark.timeout(120)
def test_dead_letters_are_listed_replayed_and_purged(pools, tmp_path):
    qp = pools.queue(2, max_retries=0)
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    ids = qp.batch_submit([(fail_first_run, i, str(tmp_path)) for i in range(6)])
    ok = qp.batch_submit([(tasks.double, i) for i in range(20)])
    cp.join(timeout=60)
    assert set(cp.failures()) == set(ids)
    dead = qp.dead_letters()
    assert sorted(d.task_id for d in dead) == sorted(ids)
    d = next(d for d in dead if d.task_id == ids[3])
    assert isinstance(d, DeadLetter) and d.error_type.endswith("ValueError") and "not yet: 3" in d.message
    assert d.payload[0] is fail_first_run or d.payload[0].__name__ == "fail_first_run"
    assert d.payload[1] == (3, str(tmp_path)) and d.attempts == 1
    assert isinstance(d.when, datetime.datetime)
    assert abs((datetime.datetime.now() - d.when).total_seconds()) < 120
    assert len(qp.dead_letters(limit=2)) == 2
    for i in range(6):
        (tmp_path / str(i)).touch()
    assert qp.replay_dead(ids[:4]) == 4
    cp.join(timeout=60)
    assert [qp.result(i, timeout_s=30) for i in ids[:4]] == [0, 10, 20, 30]
    assert sorted(d.task_id for d in qp.dead_letters()) == sorted(ids[4:])
    assert qp.purge(dead=True) == {"dead": 2, "ready": 0}
    assert qp.dead_letters() == []
    assert all(cp.results()[i] == 2 * k for k, i in enumerate(ok))


@pytest.mark.timeout(60)
def test_purge_ready_drops_waiting_messages(pools):
    qp = pools.queue(2)
    qp.batch_submit([(tasks.double, i) for i in range(100)])
    assert qp.purge(dead=False, ready=True) == {"dead": 0, "ready": 100}
    assert sum(s.pending for s in qp.stats()) == 0


@pytest.mark.timeout(180)
def test_a_durable_pool_keeps_dead_letters_whole_across_a_restart(client, tmp_path):
    from daskqueue import ConsumerPool, QueuePool

    path = tmp_path / "pool"
    qp = QueuePool(client, 1, durability="durable", dirpath=path, max_retries=0)
    cp = ConsumerPool(client, qp, n_consumers=1)
    cp.start()
    ids = qp.batch_submit([(fail_first_run, i, str(tmp_path)) for i in range(3)], key="k")
    raw = qp.put_many([{"item": 1}])
    cp.join(timeout=60)
    before = {d.task_id: d for d in qp.dead_letters()}
    assert set(before) == set(ids) | set(raw)  # the raw item failed too: GeneralConsumer runs tasks
    cp.close()
    qp.close()
    qp = QueuePool(client, 1, durability="durable", dirpath=path, max_retries=0)
    try:
        after = {d.task_id: d for d in qp.dead_letters()}
        assert set(after) == set(before)
        for i in ids:
            assert after[i].payload[1:] == before[i].payload[1:] and after[i].key == "k"
            assert after[i].message == before[i].message
            assert abs((after[i].when - before[i].when).total_seconds()) < 1
        assert after[raw[0]].payload == {"item": 1}
        for i in range(3):
            (tmp_path / str(i)).touch()
        assert qp.replay_dead(ids) == 3
        cp = ConsumerPool(client, qp, n_consumers=1)
        cp.start()
        cp.join(timeout=60)
        assert [qp.result(i, timeout_s=30) for i in ids] == [0, 10, 20]
        cp.close()
    finally:
        qp.close()
    qp = QueuePool(client, 1, durability="durable", dirpath=path, max_retries=0)
    try:  # replayed ones are no longer dead after a restart either
        assert [d.task_id for d in qp.dead_letters()] == raw
    finally:
        qp.close()


def test_a_dead_letter_keeps_its_own_payload_not_its_put_batch():
    from array import array

    from daskqueue.queue.base import ChunkPayload, detach_payload
    from tests.queue.test_core import make_core

    core = make_core(max_retries=0)
    core.core.detach = detach_payload
    data = b"".join(bytes([i]) * 1000 for i in range(50))
    offsets = array("I", [1000 * i for i in range(51)])
    chunk = core.new_chunk(50, payload=ChunkPayload(offsets, data))
    core.put(chunk, now=0)
    lease = core.get_batch(50, now=0)
    core.settle(lease.lease_id, done=50, errors={7: b"E\x00m\x00t"}, now=0)
    (dead,) = core.dead
    assert dead.chunk is not chunk and len(dead.chunk.payload.data) == 1000
    assert dead.chunk.payload.data == bytes([7]) * 1000
