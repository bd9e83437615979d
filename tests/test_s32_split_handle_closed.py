"""A call through a closed *attached* handle raises :class:`PoolClosedError` whose message
says the handle was closed and the pool stays open (and how to get a new handle), not that
the pool's owner closed the pool (which it did not). On the shared cluster; the handle
attaches through a client of its own, as ``test_fixes6_attached`` does."""

from __future__ import annotations

import pickle

import pytest
from distributed import Client

from daskqueue import QueuePool
from daskqueue.errors import PoolClosedError
from tests import tasks


@pytest.mark.timeout(120)
def test_a_call_through_a_closed_attached_handle_says_the_handle_was_closed_not_the_pool(client, pools):
    qp = pools.queue(1, name="s32-split-closed-handle")
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    with Client(client.scheduler.address, set_as_default=False) as own:
        attached = QueuePool.attach(own, "s32-split-closed-handle")
        assert attached.map(tasks.double, range(3), timeout_s=60) == [0, 2, 4]
        handle = attached.table.handles[0]
        attached.close()
        with pytest.raises(PoolClosedError) as info:
            handle.stats()
    error = info.value
    message = str(error)
    assert error.name == "s32-split-closed-handle"
    assert "closed by its owner" not in message, message
    assert message.startswith(f"attached handle (producer {attached.producer}) on queue pool "
                              "'s32-split-closed-handle' was closed"), message
    assert "the pool stays open" in message and "QueuePool.attach(client, 's32-split-closed-handle')" in message
    # It crosses processes whole (the handle and the detail are not dropped).
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is PoolClosedError and str(again) == message and again.name == error.name
    assert qp.map(tasks.double, range(3), timeout_s=60) == [0, 2, 4]  # the pool itself is open


@pytest.mark.timeout(10)
def test_a_pool_closed_by_its_owner_still_says_so():
    error = PoolClosedError("p", "it is no longer registered")
    assert str(error) == "queue pool 'p' was closed by its owner: it is no longer registered"
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
