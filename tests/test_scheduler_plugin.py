"""The scheduler plugin's bookkeeping of the queues' load reports and the pools' demand for a
worker (issue 21): what it counts towards ``adapt``'s target. The target itself, on real
adaptive LocalClusters, is tested in ``tests/test_zero_workers.py``."""

from __future__ import annotations

import pytest

from daskqueue.scheduler_plugin import DEMAND_TOPIC, LOAD_TOPIC, MembershipPlugin


def report(plugin, queue=0, ready=0, leased=0, delayed=0, worker="tcp://w:1", pool="p"):
    plugin.log_event(LOAD_TOPIC, {"pool": pool, "queue": queue, "ready": ready, "delayed": delayed,
                                  "leased": leased, "task_s": None, "worker": worker})
    return plugin.loads[(pool, queue)]


@pytest.mark.timeout(10)
def test_a_backlog_counts_once_two_reports_in_a_row_had_work():
    plugin = MembershipPlugin()
    assert not report(plugin, ready=5).confirmed  # one report: maybe a burst already over
    assert report(plugin, ready=3, leased=1).confirmed
    empty = report(plugin)
    assert not empty.confirmed and not empty.busy
    assert not report(plugin, ready=1).confirmed  # a new run of work starts over


@pytest.mark.timeout(10)
def test_delayed_messages_keep_a_queue_busy_without_counting_as_backlog():
    plugin = MembershipPlugin()
    report(plugin, delayed=4)
    load = report(plugin, delayed=4)
    assert load.busy and not load.confirmed


@pytest.mark.timeout(10)
def test_reports_of_a_worker_that_left_are_dropped_with_it():
    class Scheduler:  # what remove_worker uses of the scheduler: its event log
        def log_event(self, topic, msg):
            pass

    plugin = MembershipPlugin()
    report(plugin, queue=0, ready=5, worker="tcp://a:1")
    report(plugin, queue=1, ready=5, worker="tcp://b:1")
    plugin.remove_worker(Scheduler(), "tcp://a:1", stimulus_id="test")
    assert set(plugin.loads) == {("p", 1)}


@pytest.mark.timeout(10)
def test_a_pools_demand_stays_until_withdrawn_or_its_client_disconnects():
    plugin = MembershipPlugin()

    def demand(pool, queue, want, client="c1"):
        plugin.log_event(DEMAND_TOPIC, {"pool": pool, "queue": queue, "client": client, "want": want})

    demand("p", 0, True)
    demand("p", 1, True)
    demand("q", 0, True, client="c2")
    demand("p", 0, False)
    assert set(plugin.demand) == {("p", 1), ("q", 0)}
    demand("p", None, False)  # the pool closed: all of it
    assert set(plugin.demand) == {("q", 0)}
    plugin.remove_client(None, "c2")
    assert not plugin.demand
