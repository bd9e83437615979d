"""Client-side submission faults, continued: a map interrupted part-way (a ``KeyboardInterrupt``
while it waits for a put's answer or encodes a batch) drops exactly the outcomes of what it
stored, filing none with ``results()`` and losing none of another caller's. On the shared
cluster; the interrupt is raised in the client by a patched method of the pool's sender or
by an argument's pickling, Dask itself stays real."""

from __future__ import annotations

import threading

import pytest

from tests import tasks
from tests.helpers import wait_until


def started(pools, n_queues=2, n_consumers=2, **kwargs):
    qp = pools.queue(n_queues, max_retries=0, **kwargs)
    cp = pools.consumer(qp, n_consumers=n_consumers)
    cp.start()
    return qp, cp


def _nothing_registered(qp):
    """The collector routes nothing to a claim any more (a peek at its private tables: no
    public view of what it routes)."""
    return not any(qp.collector._claims) and not qp.collector._closing


class Interrupting:
    """An argument whose pickling is interrupted, as by Ctrl-C while ``map`` encodes it."""

    def __reduce__(self):
        raise KeyboardInterrupt


def _interrupt_the_second_answer(qp, monkeypatch):
    """The calling thread's second wait for a put's answer is interrupted (other threads'
    puts are answered as usual)."""
    caller = threading.current_thread()
    real = qp.sender._put_answer
    calls = []

    def put_answer(*args, **kwargs):
        if threading.current_thread() is caller:
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(qp.sender, "_put_answer", put_answer)
    return calls


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where, keyed", [("answer", False), ("answer", True), ("encode", False)])
def test_an_interrupted_map_files_none_of_its_outcomes_and_loses_none_of_others(pools, monkeypatch, where, keyed):
    # Puts of 10 over 2 queues: 4 puts, all sent before the first answer is read. The
    # interrupt comes with one put answered and three in flight ("answer"), or while the
    # third batch is encoded, two puts in flight ("encode").
    qp, cp = started(pools, put_batch_size=10)
    before = qp.batch_submit([(tasks.double, i) for i in range(5)])
    items = list(range(40))
    if where == "encode":
        items[25] = Interrupting()
    else:
        calls = _interrupt_the_second_answer(qp, monkeypatch)
    other = {}
    other_map = threading.Thread(target=lambda: other.update(out=qp.map(tasks.double, range(300), timeout_s=90)))
    other_map.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            qp.map(tasks.double, items, key=(lambda x: f"k{x % 4}") if keyed else None)
    finally:
        other_map.join(timeout=100)
    assert other["out"] == [2 * x for x in range(300)]
    if where == "answer":
        assert len(calls) >= 2
    stats = qp.stats()
    assert sum(s.total_put for s in stats) > 305  # some of the interrupted map's tasks were stored
    wait_until(lambda: sum(s.total_acked for s in qp.stats()) == sum(s.total_put for s in qp.stats()),
               timeout_s=60)
    qp.poll_outcomes()
    wait_until(lambda: _nothing_registered(qp), timeout_s=30)
    assert qp.results() == {task_id: 2 * i for i, task_id in enumerate(before)}
    assert qp.failures() == {}
    assert qp.map(tasks.double, range(3)) == [0, 2, 4]  # the pool maps on


@pytest.mark.timeout(120)
@pytest.mark.parametrize("keyed", [False, True])
def test_a_failed_maps_error_lists_the_ids_of_what_was_stored_by_input_position(pools, keyed):
    # Queue 1 refuses every put: the error's stored_ids hold queue 0's ids where it stored the
    # messages (whole puts of 10), None elsewhere. The list is built only on failure now.
    from daskqueue.errors import QueueClosedError
    from daskqueue.messages import split_id

    qp, cp = started(pools, put_batch_size=10)
    qp.queues[1].close().result(timeout=30)
    with pytest.raises(QueueClosedError) as info:
        qp.map(tasks.double, range(40), key=(lambda x: f"k{x}") if keyed else None)
    ids = info.value.stored_ids
    assert len(ids) == 40
    stored = {p: i for p, i in enumerate(ids) if i is not None}
    assert len(stored) == qp.queues[0].stats().result(timeout=30).total_put > 0
    assert {split_id(i)[0] for i in stored.values()} == {0}
    assert len(set(stored.values())) == len(stored)
    if not keyed:  # round-robin puts of 10 consecutive positions each
        assert all(p // 10 * 10 in stored and p // 10 * 10 + 9 in stored for p in stored)


def _mixed(shape, n=101):
    """Tasks of two functions: ``tasks.add`` at even positions, ``tasks.double`` at odd ones
    ("alternating": the first, last and quarter positions all call add), or all add but
    for one double at position 37 ("one odd task") or at the end ("last differs")."""
    if shape == "alternating":
        return [(tasks.double if i % 2 else tasks.add, i) for i in range(n)]
    odd = 37 if shape == "one odd task" else n - 1
    return [(tasks.double if i == odd else tasks.add, i) for i in range(n)]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("shape", ["alternating", "one odd task", "last differs"])
def test_tasks_of_several_functions_leave_the_uniform_path_however_they_mix(shape):
    from daskqueue.queue.encode import PutOptions, encode_uniform

    assert encode_uniform(_mixed(shape), PutOptions(), size=10, limit=2**20) is None
    uniform = [(tasks.add, i) for i in range(101)]
    assert encode_uniform(uniform, PutOptions(), size=10, limit=2**20) is not None
    assert encode_uniform([list(t) for t in uniform], PutOptions(), size=10, limit=2**20) is not None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape", ["alternating", "one odd task", "last differs"])
def test_a_batch_submit_of_several_functions_runs_each_task_with_its_own(pools, shape):
    qp, cp = started(pools)
    batch = _mixed(shape)
    ids = qp.batch_submit(batch)
    cp.join(timeout=45)
    results = qp.results()
    assert [results[i] for i in ids] == [func(x) for func, x in batch]


@pytest.mark.timeout(120)
def test_a_map_gets_the_outcomes_of_its_tasks_moved_to_an_added_queue_however_late_the_move_is_recorded(
        pools, monkeypatch):
    # add_queues moves the waiting messages of the keys the new queue takes over to it, where
    # they run at once; the client records the move (their new ids) 3 s late, as a loaded
    # client thread may. An outcome polled from the new queue meanwhile must still reach the
    # map, under its old id, not be filed under the new one in results() (the map would wait
    # for it for good). (add_queues, not remove_queue: no queue closes under the map's polls.)
    import functools
    import time

    qp, cp = started(pools, n_consumers=2)
    real_moved = qp.collector.moved

    moved = []

    def moved_late(runs, old_queue):
        time.sleep(3.0)
        real_moved(runs, old_queue)
        moved.extend(runs)

    monkeypatch.setattr(qp.collector, "moved", moved_late)
    out = {}
    mapping = threading.Thread(target=lambda: out.update(got=qp.map(
        functools.partial(tasks.sleep_then, seconds=0.01), range(400), key=lambda x: f"k{x % 40}", timeout_s=45)))
    mapping.start()
    try:
        wait_until(lambda: sum(s.ready for s in qp.stats()) >= 200, timeout_s=30, interval_s=0.002)
        assert qp.add_queues(1) == [2]
    finally:
        mapping.join(timeout=90)
    assert moved  # some messages moved
    assert out.get("got") == list(range(400))
    assert qp.results() == {}
