"""How soon ``adapt`` sees a queue's backlog (issue 24, churn): the scheduler counts a backlog
once two load reports in a row had work, and a queue sends its second report
``LOAD_CONFIRM_S`` after its first, not a whole ``LOAD_REPORT_S`` later. On real
LocalClusters with ``adapt``; workers in this process, so that the patched periods hold."""

from __future__ import annotations

import pytest

from daskqueue import ConsumerPool, QueuePool
from daskqueue.queue import sweeper
from tests import tasks
from tests.helpers import wait_until


def counted_backlog(client):
    """The workers the scheduler's plugin counts for the queues' reported backlog."""
    def target(dask_scheduler):
        return dask_scheduler.plugins["daskqueue-membership"].queue_target()

    return client.run_on_scheduler(target)


@pytest.mark.timeout(90)
def test_adapt_scales_up_for_a_backlog_before_the_queues_next_regular_report(cluster_factory, monkeypatch):
    """The regular report period is 30 s here: the backlog must count, and ``adapt`` start a
    worker for it, long before (it waited for that period's report before the fix)."""
    monkeypatch.setattr(sweeper, "LOAD_REPORT_S", 30.0)
    cluster, client = cluster_factory(1, processes=False)
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp, isolation="thread")
    cp.start()
    # 20 tasks of 0.3 s are 6 s of work: 2 workers for a 1 s target duration.
    cluster.adapt(minimum=1, maximum=2, interval="100ms", target_duration="1s")

    assert qp.batch_submit([(tasks.sleep_then, i, 0.3) for i in range(20)])
    wait_until(lambda: counted_backlog(client) > 0, timeout_s=10, interval_s=0.05)
    wait_until(lambda: len(cluster.plan) == 2, timeout_s=10, interval_s=0.05)
    wait_until(lambda: qp.stats()[0].pending == 0, timeout_s=60)
    assert cp.failures() == {}
    cp.close()
    qp.close()


@pytest.mark.timeout(90)
def test_a_backlog_counts_at_the_first_settle_that_leaves_work(cluster_factory, monkeypatch):
    """Both report periods are 30 s here: the second report, which makes the scheduler count
    the backlog, must come with the first settle that leaves work (sized by the measured
    seconds per message), not at a period's end."""
    monkeypatch.setattr(sweeper, "LOAD_REPORT_S", 30.0)
    monkeypatch.setattr(sweeper, "LOAD_CONFIRM_S", 30.0)
    cluster, client = cluster_factory(1, processes=False)
    qp = QueuePool(client, 1)
    cp = ConsumerPool(client, qp, isolation="thread")
    cp.start()

    assert qp.batch_submit([(tasks.sleep_then, i, 0.02) for i in range(200)])
    wait_until(lambda: counted_backlog(client) > 0, timeout_s=10, interval_s=0.05)
    wait_until(lambda: qp.stats()[0].pending == 0, timeout_s=60)
    assert cp.failures() == {}
    cp.close()
    qp.close()
