"""Moving messages between queues when the call to one source fails: the moves the other
sources made are still read and recorded. On the shared cluster; the failing call is a
patched method of the pool's table (Dask itself stays real)."""

from __future__ import annotations

import pytest

from daskqueue.errors import QueueCallTimeoutError
from daskqueue.messages import split_id
from tests import tasks
from tests.helpers import wait_until


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fails", ["call", "answer"])
def test_the_moves_made_while_another_sources_call_failed_are_recorded(pools, monkeypatch, fails):
    # Keyed messages wait in one queue (no consumer yet); add_queues(1) moves those whose keys
    # the ring now gives queue 2. The move_out call to the other, empty, queue fails (not
    # sent, or sent first and not answered); the full queue's was sent and moved messages:
    # its answer must be read and recorded, else their outcomes come from queue 2 under ids
    # nobody knows and the waits for the ids given never end.
    qp = pools.queue(2, max_retries=0)
    moved_source = 0 if fails == "call" else 1
    keys = [k for k in (f"k{i}" for i in range(2000)) if qp.router.key_queue(k) == moved_source][:200]
    ids = qp.batch_submit([(tasks.double, i) for i in range(200)], keys=keys)
    assert {split_id(i)[0] for i in ids} == {moved_source}
    table = qp.table
    if fails == "call":
        call = table.call

        def call_failing(q, method, *args):
            if method == "move_out" and q == 1:
                raise QueueCallTimeoutError(q, method, 0.0)
            return call(q, method, *args)

        monkeypatch.setattr(table, "call", call_failing)
    else:
        answer = table.answer

        def answer_failing(q, pending, deadline=None):
            if pending.method == "move_out" and q == 0:  # the first read: queue 1's is never read without the fix
                raise QueueCallTimeoutError(q, "move_out", 0.0)
            return answer(q, pending, deadline)

        monkeypatch.setattr(table, "answer", answer_failing)
    with pytest.raises(QueueCallTimeoutError):
        qp.add_queues(1)
    monkeypatch.undo()
    wait_until(lambda: [s for s in qp.stats() if s.index == 2][0].total_put > 0, timeout_s=30)
    stats = {s.index: s for s in qp.stats()}
    assert 0 < stats[2].total_put < 200  # the source that answered moved some
    assert table.put_counts == [stats[q].total_put - stats[q].total_moved for q in range(3)]
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    assert [qp.result(i, timeout_s=60) for i in ids] == [2 * i for i in range(200)]
