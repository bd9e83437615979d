"""A big ``batch_submit`` fetches and files the outcomes that arrive while it waits for its
puts' answers (the client was idle there, and the ``join`` or ``as_completed`` after it did
all the filing on its critical path); nothing else about the submission changes."""

from __future__ import annotations

import pytest

from daskqueue.queue.sending import FILE_WHILE_SENDING_MIN
from tests import tasks


def _counting_polls(qp):
    calls = []
    poll = qp.collector.poll

    def counted(*args, **kwargs):
        calls.append(kwargs.get("wait_s", 0.0))
        return poll(*args, **kwargs)

    qp.collector.poll = counted
    return calls


@pytest.mark.timeout(120)
def test_a_big_batch_submit_polls_outcomes_while_it_waits_for_its_puts(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    n = FILE_WHILE_SENDING_MIN + 1000
    calls = _counting_polls(qp)
    ids = qp.batch_submit([(tasks.double, i) for i in range(n)])
    during = len(calls)
    cp.join(timeout=90)
    got = qp.results(clear=True)
    assert during >= 1  # at least the wait for the first put's answer
    assert len(got) == n and all(got[i] == 2 * k for k, i in enumerate(ids))


@pytest.mark.timeout(120)
def test_a_small_batch_submit_does_not_poll(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    calls = _counting_polls(qp)
    ids = qp.batch_submit([(tasks.double, i) for i in range(1000)])
    assert calls == []
    assert sorted(v for _, v in cp.as_completed(ids, timeout=90)) == [2 * i for i in range(1000)]


@pytest.mark.timeout(120)
def test_outcomes_filed_during_a_big_submit_still_reach_as_completed(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    n = FILE_WHILE_SENDING_MIN + 1000
    first = qp.batch_submit([(tasks.double, i) for i in range(n)])
    second = qp.batch_submit([(tasks.double, i) for i in range(n)])  # files outcomes of the first
    for ids in (first, second):
        got = dict(cp.as_completed(ids, timeout=90))
        assert len(got) == n and all(got[i] == 2 * k for k, i in enumerate(ids))
    assert qp.results() == {}
