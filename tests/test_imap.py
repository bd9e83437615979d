"""``QueuePool.imap`` / ``imap_unordered``: input order (or arrival order), errors raised at
their position or returned in place, a window that bounds how far the input is pulled, early
close, empty input, timeouts and stopped consumers. On the shared cluster."""

from __future__ import annotations

import functools
import itertools

import pytest

from daskqueue import ConsumerPool, QueuePool
from daskqueue.errors import JoinTimeoutError, NoConsumersError, QueueCallTimeoutError, QueueLostError, RemoteTaskError
from tests import stream_tasks, tasks
from tests.helpers import kill_worker, wait_until


class Pulled:
    """An input that counts how far it was pulled, and notes the most items pulled and not
    yet consumed by the test (``in_flight_max``)."""

    def __init__(self, items):
        self.items = iter(items)
        self.pulled = 0
        self.consumed = 0
        self.in_flight_max = 0

    def __iter__(self):
        for x in self.items:
            self.pulled += 1
            self.in_flight_max = max(self.in_flight_max, self.pulled - self.consumed)
            yield x


def started(pools, n_queues=2, n_consumers=2, **kwargs):
    qp = pools.queue(n_queues, max_retries=0, **kwargs)
    # Tasks on the consumers' threads: where they run is no concern of the client's streams,
    # and a child process per consumer (the default next to a queue) costs ~0.5 s of CPU.
    cp = pools.consumer(qp, n_consumers=n_consumers, isolation="thread")
    cp.start()
    return qp, cp


@pytest.mark.timeout(60)
def test_imap_yields_input_order_though_later_items_finish_first_with_keys_too_and_none_for_no_input(pools):
    qp, _ = started(pools)
    out = list(qp.imap(stream_tasks.slower_first, (x for x in range(20)), window=6))
    assert out == list(range(20))
    keyed = list(qp.imap(tasks.double, range(50), window=8, key=lambda x: f"k{x % 3}"))
    assert keyed == [2 * x for x in range(50)]
    assert list(qp.imap(tasks.double, iter([]))) == []  # an empty input yields nothing
    assert list(qp.imap_unordered(tasks.double, [])) == []


@pytest.mark.timeout(60)
def test_imap_unordered_yields_each_result_as_it_arrives(pools, tmp_path):
    qp, _ = started(pools)
    gate = tmp_path / "gate"
    stream = qp.imap_unordered(functools.partial(stream_tasks.zero_waits_for, path=str(gate)),
                               (x for x in range(60)), window=60)
    out = [next(stream) for _ in range(20)]  # yielded while the first item still runs
    assert 0 not in out
    gate.touch()
    out += list(stream)
    assert sorted(out) == list(range(60))


@pytest.mark.timeout(60)
def test_imap_raises_a_failed_task_at_its_position(pools):
    qp, _ = started(pools)
    seen = []
    with pytest.raises(RemoteTaskError, match="odd 3"):
        for value in qp.imap(tasks.fail_if_odd, [0, 2, 4, 3, 6, 7], window=4):
            seen.append(value)
    assert seen == [0, 2, 4]


@pytest.mark.timeout(60)
def test_imap_returns_failures_in_place_with_errors_return(pools):
    qp, _ = started(pools)
    out = list(qp.imap(tasks.fail_if_odd, range(7), window=3, errors="return"))
    assert [x for x in out if not isinstance(x, RemoteTaskError)] == [0, 2, 4, 6]
    assert [i for i, x in enumerate(out) if isinstance(x, RemoteTaskError)] == [1, 3, 5]
    assert out[3].exc_type == "ValueError" and "odd 3" in out[3].exc_message
    unordered = list(qp.imap_unordered(tasks.fail_if_odd, range(7), errors="return"))
    assert sorted(x for x in unordered if not isinstance(x, RemoteTaskError)) == [0, 2, 4, 6]
    assert sum(isinstance(x, RemoteTaskError) for x in unordered) == 3
    with pytest.raises(RemoteTaskError):
        list(qp.imap_unordered(tasks.fail_if_odd, range(7)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [True, False])
def test_the_input_is_pulled_at_most_a_window_ahead_of_what_was_consumed(pools, ordered):
    qp, _ = started(pools)
    source = Pulled(range(300))
    stream = (qp.imap if ordered else qp.imap_unordered)(tasks.double, source, window=16)
    first = next(stream)
    assert source.pulled <= 16  # the first result came before more than a window was pulled
    source.consumed = 1
    out = [first]
    for value in stream:
        out.append(value)
        source.consumed += 1
    assert sorted(out) == [2 * x for x in range(300)]
    assert source.in_flight_max <= 16


@pytest.mark.timeout(60)
def test_closing_a_stream_early_pulls_no_more_and_leaves_no_outcome_behind(pools):
    qp, cp = started(pools)
    source = Pulled(itertools.count())  # endless
    slow = functools.partial(tasks.sleep_then, seconds=0.02)  # most of the window still runs at the close
    stream = qp.imap(slow, source, window=40)
    assert [next(stream) for _ in range(5)] == [0, 1, 2, 3, 4]
    stream.close()
    pulled = source.pulled
    assert pulled <= 45
    cp.join(timeout=30)  # the tasks put before the close still run
    qp.poll_outcomes()
    assert source.pulled == pulled
    assert qp.results() == {} and qp.failures() == {}  # their outcomes were dropped, not kept
    # ... and the collector let go of the closed stream's chunks once they settled, not at
    # the next imap() call (a peek at its private table: no public view of what it routes).
    assert not any(qp.collector._claims)
    assert list(qp.imap(tasks.double, range(3))) == [0, 2, 4]  # the pool streams on
    for value in qp.imap(tasks.double, range(100), window=10):  # a break does the same
        if value == 10:
            break
    cp.join(timeout=30)
    qp.poll_outcomes()
    assert qp.results() == {}


@pytest.mark.timeout(60)
def test_a_wait_longer_than_timeout_s_raises_join_timeout(pools):
    qp, _ = started(pools)
    stream = qp.imap(functools.partial(tasks.sleep_then, seconds=3.0), [1], timeout_s=0.5)
    with pytest.raises(JoinTimeoutError):  # not the result: the wait gave up before the task ended
        next(stream)


@pytest.mark.timeout(60)
def test_imap_needs_started_consumers_and_raises_when_they_stop(pools):
    qp = pools.queue(1)
    with pytest.raises(NoConsumersError, match="start"):
        qp.imap(tasks.double, range(3))  # at the call, not at the first next()
    cp = pools.consumer(qp, n_consumers=1)
    cp.start()
    stream = qp.imap(functools.partial(tasks.sleep_then, seconds=0.05), range(200), window=50, timeout_s=20)
    assert next(stream) == 0
    cp.cancel()
    with pytest.raises(NoConsumersError, match="in flight"):
        for _ in stream:
            pass
    wait_until(lambda: not cp.running, timeout_s=10)


def _nothing_registered(qp):
    """The collector routes nothing to a stream's chunks any more (a peek at its private
    tables: no public view of what it routes)."""
    return not any(qp.collector._claims) and not qp.collector._closing


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [True, False])
def test_a_chunk_whose_put_failed_part_way_raises_and_stays_registered_nowhere(pools, monkeypatch, ordered):
    qp, cp = started(pools)
    real_call, puts = qp.table.call, itertools.count()

    def call(q, method, *args):  # queue 1 refuses its third put on: a chunk is stored on queue 0 only
        if method == "put_batch" and q == 1 and next(puts) >= 2:
            raise QueueCallTimeoutError(1, "put_batch", 0.0)
        return real_call(q, method, *args)

    monkeypatch.setattr(qp.table, "call", call)
    stream = (qp.imap if ordered else qp.imap_unordered)(tasks.double, range(10_000), window=400)
    with pytest.raises(QueueCallTimeoutError):
        for _ in stream:
            pass
    monkeypatch.undo()
    cp.join(timeout=30)  # what was stored runs; its outcomes are dropped as they arrive
    qp.poll_outcomes()
    assert _nothing_registered(qp)
    assert qp.results() == {}
    assert list(qp.imap(tasks.double, range(3))) == [0, 2, 4]  # the pool streams on


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ordered", [True, False])
def test_a_stream_whose_transient_queue_is_lost_raises_it_and_stays_registered_nowhere(cluster_factory, ordered):
    _, client = cluster_factory(3)
    qp = QueuePool(client, 2, max_retries=0)
    cp = ConsumerPool(client, qp, isolation="thread")
    try:
        cp.start()
        victim = qp.queues[1]._address
        assert qp.queues[0]._address != victim
        slow = functools.partial(tasks.sleep_then, seconds=0.02)
        stream = (qp.imap if ordered else qp.imap_unordered)(slow, itertools.count(), window=200)
        assert len([next(stream) for _ in range(20)]) == 20
        kill_worker(client, victim)
        with pytest.raises(QueueLostError) as caught:  # in bounded time (the test's timeout), never a hang
            for _ in stream:
                pass
        assert caught.value.queue_index == 1
        assert _nothing_registered(qp)
    finally:
        cp.close()
        qp.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [True, False])
def test_an_item_that_cannot_be_pickled_in_a_later_put_of_a_chunk_raises_and_leaves_nothing_behind(pools, ordered):
    # Chunks are encoded batch by batch as they are put: with 10 messages per put, a chunk
    # of two rounds is four puts, and position 115 is in the fourth put of the third chunk,
    # encoded once the chunk's first three puts are sent (they run, their outcomes dropped).
    import threading

    from daskqueue.errors import SerializationError

    qp, cp = started(pools, put_batch_size=10)
    items = [threading.Lock() if i == 115 else i for i in range(200)]
    stream = (qp.imap if ordered else qp.imap_unordered)(tasks.double, items, window=400)
    with pytest.raises(SerializationError):
        for _ in stream:
            pass
    cp.join(timeout=30)
    qp.poll_outcomes()
    assert _nothing_registered(qp)
    assert qp.results() == {}
    assert list(qp.imap(tasks.double, range(3))) == [0, 2, 4]  # the pool streams on
