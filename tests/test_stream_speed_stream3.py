"""Streams' client work (branch stream3): as_completed takes a list batch_submit returned
by its kept copy, with no check per id, and still yields each outcome exactly once (a list
changed meanwhile goes the general way); a stream's puts write no ids unless one fails."""

from __future__ import annotations

import pytest

from daskqueue import outcomes
from daskqueue.queue.sending import Sender
from tests import tasks


def _started(pools):
    qp = pools.queue(2, max_retries=0)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    return qp, cp


@pytest.mark.timeout(90)
def test_as_completed_of_batch_submit_ids_checks_no_id_and_yields_each_once(pools, monkeypatch):
    qp, cp = _started(pools)
    checked = []
    real = outcomes.id_runs
    monkeypatch.setattr(outcomes, "id_runs", lambda ids: checked.append(len(ids)) or real(ids))
    dict(cp.as_completed(qp.batch_submit([(tasks.double, 0)]), timeout=60))  # the stream starts (sent_ids)
    checked.clear()
    chunks = [qp.batch_submit([(tasks.double, i) for i in range(k, k + 5000)]) for k in (0, 5000)]
    got = {}
    for ids in chunks:
        for task_id, value in cp.as_completed(ids, timeout=60):
            assert task_id not in got
            got[task_id] = value
    assert got == {i: 2 * k for k, i in enumerate(chunks[0] + chunks[1])}
    assert checked == []  # both lists were recognised, not checked id by id
    assert len(qp.collector.sent_ids) == 0  # and forgotten once taken


@pytest.mark.timeout(90)
def test_as_completed_of_a_list_changed_after_batch_submit_yields_what_it_holds(pools):
    qp, cp = _started(pools)
    ids = qp.batch_submit([(tasks.double, i) for i in range(6000)])
    value_of = {i: 2 * k for k, i in enumerate(ids)}
    ids[10], ids[11] = ids[11], ids[10]
    rest = ids[3000:]
    del ids[3000:]
    assert dict(cp.as_completed(ids, timeout=60)) == {i: value_of[i] for i in ids}
    assert dict(cp.as_completed(rest, timeout=60)) == {i: value_of[i] for i in rest}
    assert qp.results() == {}


@pytest.mark.timeout(90)
def test_closing_as_completed_part_way_gives_back_what_was_not_read(pools):
    qp, cp = _started(pools)
    ids = qp.batch_submit([(tasks.double, i) for i in range(8000)])
    stream = cp.as_completed(ids, timeout=60)
    read = dict(next(stream) for _ in range(100))
    stream.close()
    cp.join(timeout=60)
    left = qp.results(clear=True)
    assert not set(read) & set(left) and set(read) | set(left) == set(ids)
    assert all(v == 2 * ids.index(i) for i, v in {**read, **left}.items())


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ordered", [True, False])
def test_a_streams_puts_write_no_ids_when_they_succeed(pools, monkeypatch, ordered):
    qp, _ = _started(pools)
    filled = []
    send = Sender.send

    def noted(self, batches, **kwargs):
        if kwargs.get("claim") is not None:
            filled.append(kwargs.get("into") is not None)
        return send(self, batches, **kwargs)

    monkeypatch.setattr(Sender, "send", noted)
    out = list((qp.imap if ordered else qp.imap_unordered)(tasks.double, iter(range(3000)), window=1000))
    assert sorted(out) == [2 * i for i in range(3000)] and (not ordered or out == sorted(out))
    assert filled and not any(filled)
