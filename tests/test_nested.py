"""Tasks that enqueue tasks, on real clusters: ``daskqueue.get_pool()`` inside a task, a pool
passed to a task as an argument, and a worker killed while tasks enqueue follow-ups."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import daskqueue
from daskqueue import ConfigurationError, ConsumerPool, QueuePool, RemoteTaskError
from daskqueue.errors import PayloadTooLargeError
from tests import nested_tasks as nt
from tests import tasks
from tests.helpers import kill_worker, wait_until


def _pages(outcomes):
    """The page outcomes ``(doc, page)`` among all outcomes."""
    return sorted(v for v in outcomes.values() if isinstance(v, tuple))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_shelf_enqueues_documents_that_enqueue_their_pages_and_the_owner_reads_every_outcome(pools, isolation):
    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation=isolation)
    cp.start()
    shelves = [qp.submit(nt.shelf, 10 * s, 3, 4) for s in range(2)]

    cp.join(timeout=45)  # waits for the follow-ups too: the pool is idle only once they ran

    results = cp.results()
    assert len(results) == 2 + 6 + 24
    expected = sorted((10 * s + d, p) for s in range(2) for d in range(3) for p in range(4))
    assert _pages(results) == expected
    documents = [i for s in shelves for i in results[s]]
    page_ids = [i for d in documents for i in results[d]]
    assert sorted(results[i] for i in page_ids) == expected
    assert qp.result(page_ids[0], timeout_s=10) == results[page_ids[0]]
    assert cp.failures() == {}


@pytest.mark.timeout(60)
def test_follow_ups_stream_through_as_completed_of_the_owner(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp)
    cp.start()
    qp.batch_submit([(nt.document, d, 5) for d in range(4)])
    seen = dict(cp.as_completed(timeout=45))
    assert _pages(seen) == sorted((d, p) for d in range(4) for p in range(5))
    assert len(seen) == 4 + 20


@pytest.mark.timeout(60)
def test_a_pool_passed_as_an_argument_pickles_and_submits_from_the_worker(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp)
    cp.start()
    assert isinstance(pickle.loads(pickle.dumps(qp)), QueuePool)  # a handle, in this process
    docs = [qp.submit(nt.document_via, qp, d, 3) for d in range(3)]
    page_ids = [i for d in docs for i in qp.result(d, timeout_s=30)]
    assert sorted(qp.result(i, timeout_s=30) for i in page_ids) == [(d, p) for d in range(3) for p in range(3)]


@pytest.mark.timeout(60)
def test_map_inside_a_task_reads_its_own_results_and_leaves_the_owners(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, max_concurrency=2, isolation="thread")  # a free slot for the inner map
    cp.start()
    outer = qp.submit(nt.squares_inside, 6)
    assert qp.result(outer, timeout_s=40) == [x * x for x in range(6)]
    cp.join(timeout=30)
    assert cp.results() == {outer: [x * x for x in range(6)]}  # the inner map's outcomes were its own


@pytest.mark.timeout(60)
def test_imap_inside_a_task_reads_its_own_results_and_an_executor_there_is_refused(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, max_concurrency=2, isolation="thread")  # a free slot for the inner stream
    cp.start()
    outer = qp.submit(nt.squares_streamed_inside, 10)
    refused = qp.submit(nt.executor_inside)
    assert qp.result(outer, timeout_s=40) == [x * x for x in range(10)]
    assert qp.result(refused, timeout_s=40).startswith("refused: executor() is not available")
    cp.join(timeout=30)
    # The inner stream's outcomes were its own: none was filed to the owner.
    assert set(cp.results()) == {outer, refused}


@pytest.mark.timeout(60)
def test_a_follow_up_that_cannot_be_stored_fails_the_parent_with_the_typed_error(pools):
    qp = pools.queue(1, max_message_bytes=4096, max_retries=0)
    cp = pools.consumer(qp)
    cp.start()
    parent = qp.submit(nt.oversized_follow_up, 10_000)
    with pytest.raises(RemoteTaskError) as info:
        qp.result(parent, timeout_s=30)
    assert info.value.exc_type == f"{PayloadTooLargeError.__module__}.{PayloadTooLargeError.__qualname__}"


@pytest.mark.timeout(10)
def test_get_pool_outside_a_task_says_where_it_works():
    with pytest.raises(ConfigurationError, match="inside a daskqueue task"):
        daskqueue.get_pool()


# -- a worker killed while documents enqueue their pages ------------------------------------------


def _kill_the_queue_worker_mid_run(client, qp):
    """Kill the worker of queue 1 once some pages ran and documents are still enqueueing."""
    victim = qp.queues[1]._address
    wait_until(lambda: sum(s.total_acked for s in qp.stats()) >= 6, timeout_s=30, interval_s=0.05)
    kill_worker(client, victim)
    return victim


@pytest.mark.timeout(90)
def test_a_worker_killed_under_nested_submission_loses_nothing_of_a_durable_pool(cluster_factory, tmp_path):
    _, client = cluster_factory(3)
    qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "q", retry_backoff_base_s=0.05,
                   max_retries=5)
    cp = ConsumerPool(client, qp, isolation="thread")
    cp.start()
    docs = qp.batch_submit([(nt.slow_document, d, 6, 0.03) for d in range(4)])
    _kill_the_queue_worker_mid_run(client, qp)

    # Within 20 s: a document whose put met the moving queue waits only until its consumer
    # is told where the queue went (a second), not the 25 s bound of a move (a bug seen).
    cp.join(timeout=20)

    # A document whose put failed when the queue moved ran again (and put its pages again):
    # at least once, never lost.
    pages = set(_pages(cp.results()))
    assert pages == {(d, p) for d in range(4) for p in range(6)}
    assert cp.failures() == {}
    cp.close()
    qp.close()


@pytest.mark.timeout(90)
def test_a_worker_killed_under_nested_submission_of_a_transient_pool_gives_a_typed_error(cluster_factory):
    _, client = cluster_factory(3)
    qp = QueuePool(client, 2, retry_backoff_base_s=0.05, max_retries=1)
    cp = ConsumerPool(client, qp, isolation="thread")
    cp.start()
    docs = qp.batch_submit([(nt.slow_document, d, 6, 0.03) for d in range(4)])
    _kill_the_queue_worker_mid_run(client, qp)

    # The owner hears of the lost queue as a QueueLostError, never a hang...
    with pytest.raises(daskqueue.QueueLostError):
        cp.join(timeout=40)
    # ...and a document on the surviving queue either put all its pages or failed with the
    # typed error of the put that could not be stored (retried, then dead-lettered).
    for d in docs:
        if daskqueue.split_id(d)[0] != 0:
            continue
        try:
            assert len(qp.result(d, timeout_s=30)) == 6
        except RemoteTaskError as e:
            assert e.exc_type.endswith(("QueueLostError", "QueueCallTimeoutError")), e
    cp.close()
    qp.close()


@pytest.mark.timeout(60)
def test_the_documents_and_pages_example_reads_every_page_of_every_document(client):
    import random
    import runpy

    example = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "documents_and_pages.py"))
    per_doc = example["main"](client, n_docs=12)
    assert per_doc == {f"doc{d}": random.Random(d).randint(1, 40) for d in range(12)}


@pytest.mark.timeout(60)
def test_process_item_of_a_custom_consumer_enqueues_raw_items_through_get_pool(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, ConsumerClass=nt.Splitter, isolation="thread")
    cp.start()
    qp.put_many([1, 2])
    cp.join(timeout=45)
    words = sorted(v for v in cp.results().values() if isinstance(v, str))
    assert words == ["W1-0", "W1-1", "W2-0", "W2-1"]


@pytest.mark.timeout(10)
def test_a_task_started_by_map_inside_a_task_cannot_enqueue_through_get_pool():
    # Its follow-ups would be tagged with the map's own tag, whose handle closes when the
    # map returns: their outcomes would be read by no one. Refused, typed.
    from daskqueue import producers
    from daskqueue.errors import ConfigurationError

    producers.running_in(lambda tag: ("handle", tag))
    try:
        producers.set_producer(7)
        assert producers.get_pool() == ("handle", 7)  # an attached producer's task: fine
        producers.set_producer(producers.new_map_tag())
        with pytest.raises(ConfigurationError, match="map"):
            producers.get_pool()
    finally:
        producers.running_in(None)
    assert all(0 < producers.new_producer_tag() < producers.MAP_TAG for _ in range(100))


@pytest.mark.timeout(10)
def test_a_consumers_cached_task_handle_is_made_again_when_its_queues_change():
    # A handle kept from before a queue was removed would still route to it (QueueLostError
    # on every attempt of the parent task, until it is dead-lettered).
    import asyncio

    from daskqueue.producers import ProducerSpec
    from daskqueue.consumer.task_pools import PoolSource
    from daskqueue.queue.config import PoolConfig

    calls = type("Calls", (), {})()
    calls.queues = {0: object(), 1: object()}
    loop = asyncio.new_event_loop()
    try:
        source = PoolSource(ProducerSpec("p", PoolConfig(), None, (None, None)), calls, loop)
        first = source(0)
        assert source(0) is first and first.router.targets == [0, 1]
        del calls.queues[1]  # the owner removed queue 1 (or it was lost)
        again = source(0)
        assert again is not first and again.router.targets == [0]
    finally:
        loop.close()


@pytest.mark.timeout(10)
def test_a_consumer_makes_one_source_of_task_handles_and_closes_its_client():
    import threading

    from daskqueue.consumer.task_pools import TaskPools
    from daskqueue.producers import ProducerSpec
    from daskqueue.queue.config import PoolConfig

    pools = TaskPools(ProducerSpec("p", PoolConfig(), None, (None,)))
    start, got = threading.Barrier(8), []

    def first_batch():
        start.wait()
        got.append(pools.source(None, None))  # a child's twin: no loop

    threads = [threading.Thread(target=first_batch) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(s) for s in got}) == 1
    closed = []
    got[0]._client = type("C", (), {"close": lambda self, timeout: closed.append(timeout)})()
    pools.close()
    assert closed and pools.source(None, None) is not got[0]
    assert TaskPools(None).source(None, None) is None
