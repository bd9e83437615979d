"""A pool made with an asynchronous client never uses the lane, also for the calls its
``*_async`` methods make on a thread (``asyncio.to_thread``), where Dask's
``Client.asynchronous`` reads False (no running loop in that thread)."""

from __future__ import annotations

import asyncio

import pytest
from distributed import Client

from daskqueue import ConsumerPool, QueuePool
from daskqueue.queue.lane import lane_allowed
from tests import tasks
from tests.helpers import wait_until


@pytest.mark.timeout(60)
def test_an_asynchronous_client_is_refused_the_lane_on_a_thread_too(client):
    async def main():
        async with Client(client.scheduler.address, asynchronous=True, set_as_default=False) as aclient:
            address = client.scheduler_info()["workers"].popitem()[0]
            return lane_allowed(aclient, address), await asyncio.to_thread(lane_allowed, aclient, address)

    in_loop, on_thread = asyncio.run(main())
    assert not in_loop and not on_thread


@pytest.mark.timeout(120)
def test_puts_of_an_asynchronous_client_on_a_thread_never_take_the_lane(client):
    """The flaky failure of test_lane's asynchronous-client test: ``batch_submit_async``
    runs ``batch_submit`` on a thread; its first put asked for the lane's endpoint, and a
    later put or poll on a thread (once the endpoint was known) connected."""
    async def main():
        async with Client(client.scheduler.address, asynchronous=True, set_as_default=False) as aclient:
            qp = await QueuePool(aclient, 1)
            cp = await ConsumerPool(aclient, qp, n_consumers=1, isolation="thread")
            try:
                await cp.start_async()
                handle = qp.queues[0]
                peers = []
                for i in range(6):
                    ids = await qp.batch_submit_async([(tasks.double, i)])
                    assert await qp.result_async(ids[0], 30) == 2 * i
                    peers.append(handle.lane_peer())
                    await asyncio.sleep(0.05)  # the endpoint's discovery (one Dask call) answers
                return peers
            finally:
                await cp.close_async()
                await qp.close_async()

    peers = asyncio.run(main())
    assert peers == [None] * 6
