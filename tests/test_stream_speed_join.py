"""join() waits on its own outcomes: while this client's messages still have outcomes to
come it does not ask every queue's and consumer's stats on each 50 ms pass, and it still
waits for everything (and returns once all is settled)."""

from __future__ import annotations

import pytest

from tests import tasks


@pytest.mark.timeout(90)
def test_join_asks_the_stats_rarely_while_its_own_outcomes_are_to_come(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    asked = []
    stats = qp.outcomes.stats

    def counted(*args, **kwargs):
        asked.append(1)
        return stats(*args, **kwargs)

    qp.outcomes.stats = counted
    ids = qp.batch_submit([(tasks.sleep_then, i, 0.75) for i in range(4)])  # ~1.5 s on two consumers
    cp.join(timeout=60)
    assert qp.results(clear=True) == {i: x for i, x in zip(ids, range(4))}
    # Asked on the first pass, every 0.5 s, and at the end: not on each of ~30 passes.
    assert len(asked) <= 10, len(asked)


@pytest.mark.timeout(90)
def test_join_still_waits_for_messages_it_did_not_put(client, pools):
    from daskqueue import QueuePool

    qp = pools.queue(1, name="join-others")
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    other = QueuePool.attach(client, "join-others")
    try:
        other.batch_submit([(tasks.sleep_then, i, 0.5) for i in range(3)])
        assert qp.outcomes.unsettled() == 0  # none of this client's: the stats decide
        cp.join(timeout=60)
        assert sum(s.pending for s in qp.outcomes.stats()) == 0
    finally:
        other.close()


@pytest.mark.timeout(90)
def test_as_completed_streams_in_c_and_close_gives_back_what_was_not_read(pools):
    import itertools

    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    ids = qp.batch_submit([(tasks.double, i) for i in range(200)])
    cp.join(timeout=60)  # every outcome is here: as_completed hands them over in one batch
    stream = cp.as_completed(ids, timeout=60)
    assert type(iter(stream)) is itertools.chain  # no Python frame resumed per outcome
    first = next(stream)
    stream.close()  # as a generator's close(): the rest were never read, so they are results()'
    rest = qp.results(clear=True)
    assert rest == {i: 2 * x for i, x in zip(ids, range(200)) if i != first[0]}
    ids = qp.batch_submit([(tasks.double, i) for i in range(50)])
    assert dict(cp.as_completed(ids, timeout=60)) == {i: 2 * x for i, x in zip(ids, range(50))}


@pytest.mark.timeout(90)
def test_as_completed_of_every_outcome_gives_back_what_was_not_read_on_close(pools):
    qp = pools.queue(2)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    ids = qp.batch_submit([(tasks.double, i) for i in range(100)])
    cp.join(timeout=60)
    stream = cp.as_completed(timeout=60)  # no ids: taken from the dicts
    first = next(stream)
    stream.close()
    assert qp.results(clear=True) == {i: 2 * x for i, x in zip(ids, range(100)) if i != first[0]}
