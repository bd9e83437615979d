"""Due times (``eta=``, ``delay_s=``) on every enqueue call, transient and durable; a durable
message's due time survives a restart of its pool."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

from daskqueue.errors import ConfigurationError
from tests import tasks
from tests.helpers import wait_until


def test_eta_on_every_enqueue_call_holds_messages_until_then(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp)
    cp.start()
    due = time.time() + 1.5
    ids = qp.batch_submit([(tasks.timed_sleep, i, 0.0) for i in range(4)], eta=due)
    ids.append(qp.submit(tasks.timed_sleep, 4, 0.0, dq_eta=datetime.fromtimestamp(due)))
    ids.append(qp.submit(tasks.timed_sleep, 5, 0.0, dq_delay_s=1.5))
    assert sum(s.delayed for s in qp.stats()) == 6
    cp.join(timeout=60)
    starts = [cp.results()[i][1] for i in ids]
    assert min(starts) >= due - 0.05
    assert qp.map(tasks.double, [1, 2], eta=time.time() + 0.2, timeout_s=30) == [2, 4]


def test_a_bad_eta_is_a_configuration_error(pools):
    qp = pools.queue(1)
    with pytest.raises(ConfigurationError, match="eta"):
        qp.put_many([1], eta="tomorrow")
    with pytest.raises(ConfigurationError, match="not both"):
        qp.put_many([1], eta=time.time() + 5, delay_s=1)


def test_a_durable_messages_due_time_survives_a_restart(pools, tmp_path):
    qp = pools.queue(1, durability="durable", dirpath=tmp_path / "pool")
    # Far enough ahead that a reopen on a loaded machine (xdist, 2 cores) happens well before.
    due = datetime.now() + timedelta(seconds=8)
    ids = qp.put_many(["x", "y"], eta=due)
    qp.close()

    again = pools.queue(1, durability="durable", dirpath=tmp_path / "pool")
    assert again.stats()[0].delayed == 2  # still waiting for its time, not ready
    cp = pools.consumer(again)
    cp.start()
    time.sleep(0.5)
    assert again.stats()[0].delayed == 2
    wait_until(lambda: again.stats()[0].pending == 0, timeout_s=30)
    assert datetime.now() >= due
    assert set(again.failures()) == set(ids)  # raw items to GeneralConsumer fail at once
