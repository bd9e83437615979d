"""``QueueHandedOffError`` says what happened to the queue on every path that raises it.

Its text said "its worker is retiring", true only of a hand-off. A durable queue lost with its
worker and reopened elsewhere raises it too: a call made before the reopen that reaches the
old worker's address after it (a nanny restarts a killed worker on its fixed port, as batch
systems do) finds no actor there, and the pool reads that as "moved on". The worker was
lost, not retired."""

from __future__ import annotations

import pickle

import pytest

from daskqueue import QueuePool
from daskqueue.errors import QueueHandedOffError
from daskqueue.queue.table import Pending
from tests.helpers import kill_worker, wait_until



@pytest.mark.timeout(120)
def test_a_call_that_finds_a_reopened_durable_queue_gone_does_not_say_its_worker_retired(fixed_port_client, tmp_path):
    client = fixed_port_client
    qp = QueuePool(client, 1, durability="durable", dirpath=tmp_path / "pool")
    try:
        old = qp.queues[0]
        victim = old._address
        kill_worker(client, victim)
        wait_until(lambda: qp.queues[0]._address != victim and 0 not in qp.table.moving, timeout_s=60)
        wait_until(lambda: victim in client.run(lambda: 0), timeout_s=60)  # back, on its address
        old.__dict__["_future"] = None  # a call made before the reopen, arriving only now
        with pytest.raises(QueueHandedOffError) as caught:
            qp.table.answer(0, Pending(old.stats(), old, "stats", ()))
        text = str(caught.value)
        assert "retiring" not in text, text
        assert "after its worker was lost" in text and "nothing of this call was done" in text
        assert qp.table.answer_or_ask_again(0, Pending(old.stats(), old, "stats", ())).index == 0
    finally:
        qp.close()


@pytest.mark.timeout(10)
def test_a_hand_off_error_keeps_its_fields_and_its_reason_across_a_pickle():
    e = QueueHandedOffError(3, "tcp://w:1", reason="it was handed off as its worker retires")
    back = pickle.loads(pickle.dumps(e))
    assert (back.queue_index, back.address, back.reason, str(back)) == (3, "tcp://w:1", e.reason, str(e))
    assert "handed off as its worker retires" in str(back) and back.durability == "unknown"
    plain = pickle.loads(pickle.dumps(QueueHandedOffError(1, "tcp://w:2")))
    assert plain.reason is None and QueueHandedOffError.DEFAULT_REASON in str(plain)
