"""A map interrupted by Ctrl-C, with a second Ctrl-C (or the first one) landing at moments
where the send is not waiting for a queue: the put counts and the error's ``stored_ids``
must agree with what the queues stored, whenever it comes. On the shared cluster; the
interrupts are real SIGINTs raised in the client's main thread from a patched hook of the
client's own bookkeeping, Dask itself stays real."""

from __future__ import annotations

import logging
import signal
import threading

import pytest

from daskqueue.queue import sending
from tests import tasks
from tests.helpers import wait_until


def started(pools):
    qp = pools.queue(2, max_retries=0, put_batch_size=10)  # a map of 40: 4 puts of 10
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    return qp


def ctrl_c():
    """Ctrl-C, as the terminal sends it: SIGINT to this process, handled on the main thread."""
    signal.raise_signal(signal.SIGINT)


def on_main_thread_once():
    fired = []

    def fire():
        if threading.current_thread() is threading.main_thread() and not fired:
            fired.append(True)
            ctrl_c()
    return fire, fired


def interrupt_the_second_answer(qp, monkeypatch):
    """The main thread's second wait for a put's answer is interrupted."""
    real = qp.sender._put_answer
    calls = []

    def put_answer(*args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(qp.sender, "_put_answer", put_answer)


def settled_results(qp, filed=0):
    """Every stored task settled, and the outcomes filed in ``results()``: polled until at
    least ``filed`` are there (one poll may not bring every queue's outcomes on a loaded
    machine: a long poll still in flight holds some), then once more."""
    wait_until(lambda: sum(s.total_acked for s in qp.stats()) == sum(s.total_put for s in qp.stats()), timeout_s=60)

    def polled():
        qp.poll_outcomes()
        return len(qp.results()) >= filed

    wait_until(polled, timeout_s=30, interval_s=0.05)
    qp.poll_outcomes()
    return qp.results()


@pytest.mark.timeout(120)
def test_a_ctrl_c_while_a_put_is_counted_leaves_the_counts_exact(pools, monkeypatch):
    # Ctrl-C lands as the first answered put is counted (after it is noted as stored): it is
    # counted all the same, then the map raises with every put read and listed.
    qp = started(pools)
    fire, fired = on_main_thread_once()

    class Counts(list):
        def __getitem__(self, q):
            fire()
            return super().__getitem__(q)

    table = qp.sender.table
    monkeypatch.setattr(table, "put_counts", Counts(table.put_counts))
    with pytest.raises(KeyboardInterrupt) as info:
        qp.map(tasks.double, range(40))
    assert fired
    stats = qp.stats()
    assert [s.total_put for s in stats] == [20, 20]
    assert list(table.put_counts) == [20, 20]  # one put low without the fix
    assert sum(i is not None for i in info.value.stored_ids) == 40
    assert settled_results(qp) == {}  # the map's outcomes are dropped, none filed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["as the reading starts", "as the ids are listed"])
def test_a_second_ctrl_c_outside_the_wait_for_an_answer_still_raises_with_the_stored_ids(pools, monkeypatch, where):
    # The first interrupt comes while the second put's answer is awaited (one put read); the
    # second one as the interrupted send logs that it reads the other three puts' answers
    # (it stops that reading: those puts count as not stored), or once they are read, as
    # the stored ids are listed. Either way the interrupt raised carries the stored ids, and
    # the counts agree with them; without the fix it had none, and the map counted every
    # position as not stored.
    qp = started(pools)
    interrupt_the_second_answer(qp, monkeypatch)
    fire, fired = on_main_thread_once()
    if where == "as the ids are listed":
        listed = sending._listed

        def listing(*args):
            fire()
            return listed(*args)

        monkeypatch.setattr(sending, "_listed", listing)
        handler = None
    else:
        class Second(logging.Handler):
            def emit(self, record):
                if record.getMessage().startswith("reading "):
                    fire()

        handler = Second(logging.INFO)
        log = logging.getLogger("daskqueue")
        log.addHandler(handler)
        log.setLevel(logging.INFO)  # put back after the test (conftest)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            qp.map(tasks.double, range(40))
    finally:
        if handler is not None:
            logging.getLogger("daskqueue").removeHandler(handler)
    assert fired
    stored_ids = getattr(info.value, "stored_ids", None)
    assert stored_ids is not None
    listed_ids = {i for i in stored_ids if i is not None}
    expected = 10 if where == "as the reading starts" else 40
    assert len(listed_ids) == expected
    assert sum(qp.sender.table.put_counts) == expected
    results = settled_results(qp, 40 - expected)
    assert sum(s.total_put for s in qp.stats()) == 40
    # The puts not read: their tasks' outcomes, claimed by no one, are filed; the listed ones dropped.
    assert len(results) == 40 - expected and not set(results) & listed_ids


@pytest.mark.timeout(120)
def test_a_ctrl_c_as_a_whole_send_lets_go_of_its_holds_raises_with_every_id_stored(pools, monkeypatch):
    # Every put of the map is answered and recorded; Ctrl-C lands as the send lets go of the
    # queues it held (filing what came meanwhile). Nothing is read again: the interrupt is
    # raised with every position stored (without the fix: with none, and the map counted
    # every position as not stored, its outcomes then filed in results()).
    import contextlib

    qp = started(pools)
    fire, fired = on_main_thread_once()
    real = qp.collector.holding

    @contextlib.contextmanager
    def holding(queues):
        with real(queues):
            yield
            fire()

    monkeypatch.setattr(qp.collector, "holding", holding)
    with pytest.raises(KeyboardInterrupt) as info:
        qp.map(tasks.double, range(40))
    assert fired
    stored_ids = getattr(info.value, "stored_ids", None)
    assert stored_ids is not None and sum(i is not None for i in stored_ids) == 40
    assert sum(qp.sender.table.put_counts) == 40
    assert settled_results(qp) == {}
