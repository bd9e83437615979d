"""An attached producer whose messages the owner moves (``remove_queue``, ``add_queues``) gets
their outcomes under the ids it was given; an attached handle follows the queues the owner
adds and removes."""

from __future__ import annotations

import functools
import threading

import pytest

from daskqueue import QueuePool, RemoteTaskError
from daskqueue.messages import split_id
from tests import tasks
from tests.helpers import wait_until


@pytest.mark.timeout(120)
@pytest.mark.parametrize("durability", ["transient", "durable"])
def test_an_attached_producer_gets_the_outcomes_of_its_messages_moved_off_a_removed_queue(client, pools, tmp_path,
                                                                                         durability):
    name = f"attach-moved-remove-{durability}"
    qp = pools.queue(2, name=name, durability=durability,
                     dirpath=tmp_path / "q" if durability == "durable" else None)
    attached = QueuePool.attach(client, name)
    ids = attached.batch_submit([(tasks.double, i) for i in range(40)])
    owners = qp.batch_submit([(tasks.double, i) for i in range(100, 120)])
    assert {split_id(i)[0] for i in ids} == {0, 1}
    # No consumer yet: every message of queue 1 waits, and moves to queue 0.
    assert qp.remove_queue(1, timeout_s=60) >= 30
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    assert [attached.result(i, timeout_s=30) for i in ids] == [2 * i for i in range(40)]
    assert [qp.result(i, timeout_s=30) for i in owners] == [2 * i for i in range(100, 120)]
    assert sorted(attached.results()) == sorted(ids)  # none of the owner's
    assert not set(qp.results()) & set(ids)  # and none of its in the owner's
    attached.close()


@pytest.mark.timeout(120)
def test_an_attached_map_gets_every_result_while_the_owner_removes_the_queue_its_messages_wait_in(client, pools):
    qp = pools.queue(2, name="attach-moved-map")
    cp = pools.consumer(qp, n_consumers=1, max_concurrency=1, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "attach-moved-map")
    got = {}
    mapping = threading.Thread(target=lambda: got.update(
        values=attached.map(functools.partial(tasks.sleep_then, seconds=0.01), range(200), timeout_s=90)))
    mapping.start()
    wait_until(lambda: [s for s in qp.stats() if s.index == 1][0].ready >= 20, timeout_s=30)
    assert qp.remove_queue(1, timeout_s=60) > 0
    mapping.join(timeout=100)
    assert got["values"] == list(range(200))
    attached.close()


@pytest.mark.timeout(120)
def test_an_attached_producer_gets_the_outcomes_of_its_keyed_messages_moved_to_an_added_queue(client, pools):
    qp = pools.queue(2, name="attach-moved-add")
    attached = QueuePool.attach(client, "attach-moved-add")
    keys = [f"key-{i % 40}" for i in range(400)]
    ids = attached.batch_submit([(tasks.double, i) for i in range(400)], keys=keys)
    assert qp.add_queues(1) == [2]
    assert [s for s in qp.stats() if s.index == 2][0].pending > 0  # some keys moved with their messages
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    assert [attached.result(i, timeout_s=30) for i in ids] == [2 * i for i in range(400)]
    attached.close()


@pytest.mark.timeout(120)
def test_an_attached_handle_follows_queues_added_and_removed_after_it_attached(client, pools):
    qp = pools.queue(2, name="attach-follow-queues")
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "attach-follow-queues")
    assert attached.map(tasks.double, range(10), timeout_s=30) == [2 * i for i in range(10)]
    qp.add_queues(1)
    put = []

    def routed_to_the_new_queue():
        put.extend(attached.batch_submit([(tasks.double, i) for i in range(10)]))
        return 2 in {split_id(i)[0] for i in put[-10:]}

    wait_until(routed_to_the_new_queue, timeout_s=30, interval_s=0.2)
    assert [attached.result(i, timeout_s=30) for i in put] == [2 * (k % 10) for k in range(len(put))]
    qp.remove_queue(0, timeout_s=60)
    # It stops polling the removed queue and routing to it, without an error.
    wait_until(lambda: attached.map(tasks.double, range(20), timeout_s=30) == [2 * i for i in range(20)]
               and 0 not in attached.router.targets, timeout_s=30, interval_s=0.2)
    later = attached.batch_submit([(tasks.double, i) for i in range(30)])
    assert {split_id(i)[0] for i in later} <= {1, 2}
    assert [attached.result(i, timeout_s=30) for i in later] == [2 * i for i in range(30)]
    attached.close()


@pytest.mark.timeout(120)
def test_an_attached_producer_gets_the_outcome_of_its_dead_letter_replayed_by_the_owner(client, pools, tmp_path):
    qp = pools.queue(2, name="attach-moved-replay", max_retries=0)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "attach-moved-replay")
    flag = tmp_path / "ready"
    task = attached.submit(tasks.fail_unless_exists, 7, str(flag))
    with pytest.raises(RemoteTaskError):
        attached.result(task, timeout_s=30)
    flag.write_text("")
    assert qp.replay_dead() == 1
    wait_until(lambda: attached.results().get(task) == 7, timeout_s=30, interval_s=0.1)
    assert task not in attached.failures() and len(attached.results()) == 1
    attached.close()


@pytest.mark.timeout(120)
def test_the_outcomes_an_attached_producer_had_not_read_from_a_removed_queue_reach_it(client, pools):
    qp = pools.queue(2, name="attach-moved-unread")
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    attached = QueuePool.attach(client, "attach-moved-unread")
    ids = attached.batch_submit([(tasks.double, i) for i in range(40)])
    wait_until(lambda: sum(s.pending for s in qp.stats()) == 0, timeout_s=30)  # all ran; none read yet
    qp.remove_queue(1, timeout_s=60)
    assert [attached.result(i, timeout_s=30) for i in ids] == [2 * i for i in range(40)]
    attached.close()


@pytest.mark.timeout(120)
def test_an_attached_producers_messages_moved_twice_keep_their_ids(client, pools):
    qp = pools.queue(3, name="attach-moved-twice")
    attached = QueuePool.attach(client, "attach-moved-twice")
    ids = attached.batch_submit([(tasks.double, i) for i in range(60)])
    assert {split_id(i)[0] for i in ids} == {0, 1, 2}
    qp.remove_queue(1, timeout_s=60)  # to queues 0 and 2; then all of queue 0's to queue 2
    qp.remove_queue(0, timeout_s=60)
    assert [s.pending for s in qp.stats() if s.index == 2] == [60]
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    assert [attached.result(i, timeout_s=30) for i in ids] == [2 * i for i in range(60)]
    assert sorted(attached.results()) == sorted(ids)
    attached.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("change", ["remove_queue", "add_queues"])
def test_a_producer_in_another_process_maps_exactly_while_the_owner_moves_its_messages(client, pools, change,
                                                                                       tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    name = f"attach-moved-process-{change}"
    qp = pools.queue(2, name=name)
    cp = pools.consumer(qp, n_consumers=1, max_concurrency=1, isolation="thread")
    cp.start()
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    gate = tmp_path / "moved"  # its tasks are slow until then: the rest need not be
    other = subprocess.Popen([sys.executable, "-m", "tests.attach_moved_client", client.scheduler.address, name,
                              str(gate)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=root)
    try:
        # Its map's messages wait in both queues (one slow consumer).
        wait_until(lambda: all(s.ready >= 20 for s in qp.stats()), timeout_s=60, interval_s=0.05)
        if change == "remove_queue":
            assert qp.remove_queue(1, timeout_s=90) > 0
        else:
            assert qp.add_queues(1) == [2]
            assert [s for s in qp.stats() if s.index == 2][0].total_put > 0  # keys moved there
        gate.touch()
        out, err = other.communicate(timeout=120)
    finally:
        if other.poll() is None:
            other.kill()
    assert other.returncode == 0, err.decode()[-3000:]
    got = json.loads(out)
    assert got["map"] == list(range(300))
    assert got["results"] == 0 and got["failures"] == 0
    assert qp.results() == {}  # none of its outcomes in the owner's


@pytest.mark.timeout(10)
def test_moves_and_replays_put_without_the_durable_sync_wait_first() -> None:
    """Review finding 4: under fsync="always" a durable queue's ``put_batch`` answers after
    an await on the sync; ``adopt`` and ``replay_dead`` file an attached producer's moved
    record right after their put, so they must use the unwrapped body (no await between)."""
    import inspect

    from daskqueue.queue.base import QueueActorBase
    from daskqueue.queue.durable import DurableQueue

    assert DurableQueue.put_batch.__code__ is not QueueActorBase._put_now.__code__  # wrapped
    assert DurableQueue._put_now.__code__ is QueueActorBase._put_now.__code__  # the body itself
    for method in (DurableQueue.adopt, DurableQueue.replay_dead):
        source = inspect.getsource(inspect.unwrap(method))
        assert "self._put_now(" in source and "self.put_batch(" not in source, method.__name__
