"""Streaming outcomes: as_completed yields results and failures as they arrive and forgets
them; results(clear=True); the asyncio API with an asynchronous Dask Client."""

from __future__ import annotations

import pytest

from daskqueue.errors import ConfigurationError, RemoteTaskError
from tests import tasks


@pytest.mark.timeout(120)
def test_as_completed_yields_every_outcome_once_and_forgets_it(pools):
    qp = pools.queue(2, max_retries=0)
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    ok = qp.batch_submit([(tasks.double, i) for i in range(500)])
    bad = qp.batch_submit([(tasks.boom, "no")])
    seen = dict(cp.as_completed(timeout=60))
    assert len(seen) == 501
    assert [seen[i] for i in ok] == [2 * i for i in range(500)]
    assert isinstance(seen[bad[0]], RemoteTaskError)
    assert cp.results() == {} and cp.failures() == {}  # taken: nothing kept


@pytest.mark.timeout(120)
def test_as_completed_with_ids_yields_those_and_leaves_the_others(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    first = qp.batch_submit([(tasks.double, i) for i in range(100)])
    second = qp.batch_submit([(tasks.double, i) for i in range(100, 150)])
    got = dict(cp.as_completed(second, timeout=60))
    assert got == {t: 2 * i for t, i in zip(second, range(100, 150))}
    cp.join(timeout=60)
    assert cp.results(clear=True) == {t: 2 * i for t, i in zip(first, range(100))}
    assert cp.results() == {}
    with pytest.raises(ConfigurationError, match="no outcome to come"):
        list(cp.as_completed(first[:3], timeout=30))


@pytest.mark.timeout(120)
async def test_the_asyncio_api_works_with_an_asynchronous_client():
    from distributed import Client, LocalCluster

    from daskqueue import ConsumerPool, QueuePool

    async with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                            asynchronous=True) as cluster, Client(cluster, asynchronous=True) as client:
        qp = await QueuePool(client, 2)
        cp = await ConsumerPool(client, qp, n_consumers=2)
        with pytest.raises(ConfigurationError, match="_async"):
            qp.map(tasks.double, [1])  # would block the loop it needs
        await cp.start_async()
        assert await qp.map_async(tasks.double, range(200), timeout_s=60) == [2 * i for i in range(200)]
        ids = await qp.batch_submit_async([(tasks.double, i) for i in range(50)])
        got = {t: v async for t, v in cp.as_completed_async(ids, timeout=60)}
        assert got == {t: 2 * i for t, i in zip(ids, range(50))}
        await cp.join_async(timeout=60)
        await cp.close_async()
        await qp.close_async()
        default = await QueuePool(client)  # the default n_queues, counted from an async client
        assert default.n_queues >= 1
        await default.close_async()
