"""Client-side submission faults: an item a stream cannot pickle is named by its position in
the caller's input; a map whose puts fail part-way leaves nothing in ``results()``. On the
shared cluster."""

from __future__ import annotations

import functools
import time

import pytest

from daskqueue.errors import JoinTimeoutError, QueueClosedError, SerializationError
from tests import tasks
from tests.helpers import wait_until


def started(pools, n_queues=2, n_consumers=2, **kwargs):
    qp = pools.queue(n_queues, **{"max_retries": 0, **kwargs})
    # Tasks on the consumers' threads: where they run is no concern of the client's streams,
    # and a child process per consumer (the default next to a queue) costs ~0.5 s of CPU.
    cp = pools.consumer(qp, n_consumers=n_consumers, isolation="thread")
    cp.start()
    return qp, cp


class SlowToPickle:
    """An int that takes half a millisecond to pickle (and unpickles as the plain int)."""

    def __init__(self, x):
        self.x = x

    def __reduce__(self):
        time.sleep(0.0005)
        return (int, (self.x,))


def _nothing_registered(qp):
    """The collector routes nothing to a claim any more (a peek at its private tables: no
    public view of what it routes)."""
    return not any(qp.collector._claims) and not qp.collector._closing


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("bad, keyed", [(2_325, False), (2_345, False), (2_345, True)])
def test_a_stream_names_an_item_it_cannot_pickle_by_its_position_in_the_callers_input(pools, ordered, bad, keyed):
    # Chunks of 40 (window 160), puts of 10: 2,325 is in the first put of the chunk that starts
    # at 2,320 (encoded on the caller's thread), 2,345 in its third (encoded on the stream's
    # put thread, once the two before it are sent); a keyed chunk is encoded whole at once.
    qp, cp = started(pools, put_batch_size=10)
    items = (tasks.Unpicklable() if i == bad else i for i in range(3_000))
    name = "imap" if ordered else "imap_unordered"
    key = (lambda x: f"k{x % 3}" if isinstance(x, int) else "k0") if keyed else None
    stream = getattr(qp, name)(tasks.double, items, window=160, key=key)
    got = []
    with pytest.raises(SerializationError) as info:
        for x in stream:
            got.append(x)
    assert info.value.index == bad
    assert f"item {bad:,} of the {name} input" in str(info.value)
    assert "refuses to be pickled" in str(info.value)  # the rest of the message is kept
    assert isinstance(info.value.__cause__, TypeError)
    assert len(got) < bad and len(set(got)) == len(got)
    # What was put runs; its outcomes are dropped, never filed with results().
    cp.join(timeout=60)
    qp.poll_outcomes()
    wait_until(lambda: _nothing_registered(qp), timeout_s=30)
    assert qp.results() == {}
    assert list(qp.imap(tasks.double, range(3))) == [0, 2, 4]  # the pool streams on


@pytest.mark.timeout(120)
@pytest.mark.parametrize("keyed", [False, True])
def test_a_map_whose_puts_fail_part_way_files_no_outcome_with_results(pools, keyed):
    # Queue 1 refuses every put: queue 0 stores its share, whose tasks run; map keeps its
    # outcomes to itself (the caller has no id for them), so none may reach results().
    qp, cp = started(pools, put_batch_size=10)
    qp.queues[1].close().result(timeout=30)
    key = (lambda x: f"k{x}") if keyed else None
    with pytest.raises(QueueClosedError):
        qp.map(tasks.double, range(40), key=key)
    stored = qp.queues[0].stats().result(timeout=30).total_put
    assert 0 < stored < 40
    wait_until(lambda: qp.queues[0].stats().result(timeout=30).total_acked == stored, timeout_s=60)
    qp.poll_outcomes(queue_index=0)
    wait_until(lambda: _nothing_registered(qp), timeout_s=30)
    # results() would poll closed queue 1 too (and raise): the collector's own dicts.
    assert qp.collector.results == {} and qp.collector.failures == {}


@pytest.mark.timeout(120)
def test_a_map_that_times_out_files_no_outcome_with_results_as_its_tasks_end(pools):
    qp, cp = started(pools)
    with pytest.raises(JoinTimeoutError):
        qp.map(functools.partial(tasks.sleep_then, seconds=0.3), range(8), timeout_s=0.2)
    cp.join(timeout=60)
    wait_until(lambda: qp.poll_outcomes() == 0 and _nothing_registered(qp), timeout_s=30)
    assert qp.results() == {} and qp.failures() == {}
    assert qp.map(tasks.double, range(3)) == [0, 2, 4]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("call", ["map", "imap", "typed map"])
def test_a_long_map_routes_its_remaining_puts_elsewhere_while_a_queue_is_removed(pools, call):
    # put_batch_size 20 over 3 queues: 400 puts, sent as they are pickled (slowly: about 4 s
    # in all). Queue 2 is removed from another thread as soon as the map's first tasks are
    # stored: the map's later puts must go to queues 0 and 1.
    import threading

    # A typed pool routes every message of type "a" to one queue, the one removed: its puts
    # go to the type's new queue on the ring.
    # Retries allowed: on a loaded machine a lease may expire (a task delivered twice is
    # what at-least-once allows; a map must still get every result once, in its place).
    qp, cp = started(pools, n_queues=3, put_batch_size=20, max_retries=3,
                     **({"scheduler": "fair"} if call == "typed map" else {}))
    removed = {}
    victim = qp.router.route("a", None) if call == "typed map" else 2

    def remove():
        wait_until(lambda: sum(s.total_put for s in qp.stats()) > 0, timeout_s=60, interval_s=0.001)
        removed["moved"] = qp.remove_queue(victim, timeout_s=120)

    remover = threading.Thread(target=remove)
    remover.start()
    try:
        items = [SlowToPickle(x) for x in range(8_000)]
        if call == "map":
            out = qp.map(tasks.double, items, timeout_s=120)
        elif call == "typed map":
            out = qp.map(tasks.double, items, timeout_s=120, type="a")
        else:
            out = list(qp.imap(tasks.double, iter(items), window=2_400, timeout_s=120))
    finally:
        remover.join(timeout=150)
    assert out == [2 * x for x in range(8_000)]
    assert "moved" in removed and qp.queue_indices == [q for q in range(3) if q != victim]


@pytest.mark.timeout(10)
def test_only_a_refusal_by_a_removed_queue_sends_a_put_elsewhere():
    """A put that failed in a way that may have stored it (a timeout, a lost answer while the
    queue was still there) or that would fail again (a bad payload) is never put twice."""
    from types import SimpleNamespace

    from daskqueue.errors import (
        PayloadTooLargeError,
        PoolClosedError,
        QueueCallTimeoutError,
        QueueClosedError,
        QueueLostError,
    )
    from daskqueue.queue.sending import Sender

    sender = SimpleNamespace(router=SimpleNamespace(targets=[0, 2]), table=SimpleNamespace(removed=set()))
    refused = functools.partial(Sender._refused_for_removal, sender)
    assert refused(1, QueueClosedError("closed once drained"))
    assert not refused(0, QueueClosedError("a queue still routed to"))
    assert not refused(1, QueueCallTimeoutError(1, "put_batch", 5.0))
    assert not refused(1, PoolClosedError("pool"))
    assert not refused(1, PayloadTooLargeError(10, 5))
    assert not refused(1, QueueLostError(1, "tcp://x:1", "transient"))  # not removed yet: it may have stored it
    sender.table.removed.add(1)
    assert refused(1, QueueLostError(1, "tcp://x:1", "transient"))  # released with the queue
