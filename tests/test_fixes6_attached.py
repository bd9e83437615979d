"""A thread still calling through an attached handle's queue handles after the handle was
closed gets a typed ``PoolClosedError`` naming the pool, not Dask's "Worker holding Actor
was lost" (which reads as a lost worker). On the shared cluster; the handle attaches through
a client of its own, as from another process (its hold on an actor's key is its only one:
released, Dask marks its future cancelled)."""

from __future__ import annotations

import pytest
from distributed import Client

from daskqueue import QueuePool
from daskqueue.errors import PoolClosedError
from tests import tasks


@pytest.mark.timeout(120)
def test_a_call_on_a_closed_attached_handles_queue_handle_raises_pool_closed(client, pools):
    qp = pools.queue(1, name="fixes6-released")
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    with Client(client.scheduler.address, set_as_default=False) as own:
        attached = QueuePool.attach(own, "fixes6-released")
        assert attached.map(tasks.double, range(3), timeout_s=60) == [0, 2, 4]  # its handle and lane in use
        handle = attached.table.handles[0]
        attached.close()
        # Before the fix: RuntimeError("Worker holding Actor was lost.  Status: cancelled"),
        # or, until Dask cancelled the future, calls that still went out.
        for call in (lambda: handle.stats(), lambda: handle.put_batch(b"", b"0" * 16)):
            with pytest.raises(PoolClosedError) as info:
                call()
            assert info.value.name == "fixes6-released"
    assert qp.map(tasks.double, range(3), timeout_s=60) == [0, 2, 4]  # the pool itself stays open
