"""A queue removed from the pool leaves nothing behind in the result collector: no long poll
to its closed actor stays in flight (a send primes one there), while the outcomes of the
tasks it ran stay readable under their ids, and work over the other queues completes."""

from __future__ import annotations

import pytest

from daskqueue.messages import split_id
from tests import tasks


def _submit_until_on(qp, q: int) -> tuple[int, int]:
    """Submit ``double(x)`` calls until one lands on queue ``q``; its id and ``x`` (each send
    primes a long poll at its queue)."""
    for x in range(64):
        task_id = qp.submit(tasks.double, x)
        if split_id(task_id)[0] == q:
            return task_id, x
    raise AssertionError(f"no submit went to queue {q}")


@pytest.mark.timeout(60)
def test_a_removed_queue_leaves_no_long_poll_and_its_outcomes_stay_readable(pools):
    qp = pools.queue(3)
    cp = pools.consumer(qp, isolation="thread")
    cp.start()
    ran_there, x = _submit_until_on(qp, 2)
    cp.join(timeout=20)  # its outcome is in the collector, not read yet
    cp.cancel()  # nothing runs now: the next one waits at queue 2, with a long poll primed there
    waiting, y = _submit_until_on(qp, 2)
    assert 2 in qp.collector._long  # what a small send to a queue starts (outcome_polls.prime)

    qp.remove_queue(2, timeout_s=30)  # its waiting message moves to queue 0 or 1

    collector = qp.collector
    assert 2 in collector.removed
    assert 2 not in collector._long, "a long poll to the removed queue stayed in flight"
    assert 2 not in collector._holds and 2 not in collector._held
    assert qp.result(ran_there, timeout_s=5) == 2 * x  # filed before: still there
    cp.start()
    assert qp.result(waiting, timeout_s=20) == 2 * y  # it moved, and kept its id
    assert qp.map(tasks.double, range(50), timeout_s=30) == [2 * x for x in range(50)]
    assert list(qp.imap(tasks.double, range(30), timeout_s=30)) == [2 * x for x in range(30)]
    assert 2 not in collector._long
