"""Streams' client work (branch stream4): batch_submit keeps a copy of the ids it returns
only once the pool streams them (as_completed of a list); before that, and in a pool that
never streams, no copy is made and as_completed still takes any list the general way."""

from __future__ import annotations

import pytest

from daskqueue import outcomes
from tests import tasks


def _started(pools):
    qp = pools.queue(2, max_retries=0)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    return qp, cp


@pytest.mark.timeout(90)
def test_a_pool_that_never_streams_keeps_no_copy_of_the_ids(pools):
    qp, cp = _started(pools)
    ids = qp.batch_submit([(tasks.double, i) for i in range(6000)])
    more = qp.batch_submit([(tasks.double, i) for i in range(5000)])
    assert len(qp.collector.sent_ids) == 0 and not qp.collector.sent_ids.streaming
    cp.join(timeout=60)
    got = qp.results(clear=True)
    assert [got[i] for i in ids] == [2 * k for k in range(6000)]
    assert [got[i] for i in more] == [2 * k for k in range(5000)]


@pytest.mark.timeout(90)
def test_as_completed_of_lists_submitted_before_the_stream_starts(pools, monkeypatch):
    qp, cp = _started(pools)
    checked = []
    real = outcomes.id_runs
    monkeypatch.setattr(outcomes, "id_runs", lambda ids: checked.append(len(ids)) or real(ids))
    first = qp.batch_submit([(tasks.double, i) for i in range(5000)])
    second = qp.batch_submit([(tasks.double, i) for i in range(5000, 10000)])
    assert len(qp.collector.sent_ids) == 0  # no stream yet: nothing kept
    got = dict(cp.as_completed(first, timeout=60))  # the stream starts
    third = qp.batch_submit([(tasks.double, i) for i in range(10000, 15000)])
    assert len(qp.collector.sent_ids) == 1  # the stream is on: the list submitted since is kept
    for task_id, value in cp.as_completed(second, timeout=60):
        assert task_id not in got
        got[task_id] = value
    assert checked == [5000, 5000]  # both taken the general way, checked id by id
    got.update(cp.as_completed(third, timeout=60))
    assert checked == [5000, 5000]  # and taken by its copy
    assert got == {i: 2 * k for k, i in enumerate(first + second + third)}
    assert len(qp.collector.sent_ids) == 0 and qp.results() == {}
