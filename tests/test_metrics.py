"""The Prometheus metrics of daskqueue's actors, scraped from real workers' ``/metrics`` over HTTP."""

from __future__ import annotations

import sys
import urllib.request
import uuid
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daskqueue import metrics
from tests import tasks
from tests.helpers import wait_until


def scrape(client: Any) -> dict[str, list[Any]]:
    """Every worker's ``/metrics``, parsed: worker address -> its samples."""
    out = {}
    for address, info in client.scheduler_info()["workers"].items():
        host = address.split("://")[1].rsplit(":", 1)[0]
        port = info["services"]["dashboard"]
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        out[address] = [s for family in text_string_to_metric_families(text) for s in family.samples]
    return out


def samples(scraped: dict[str, list[Any]], name: str, pool: str) -> list[tuple[str, Any]]:
    """``(worker address, sample)`` of every sample called ``name`` with label ``pool``."""
    return [(addr, s) for addr, found in scraped.items() for s in found
            if s.name == name and s.labels.get("pool") == pool]


def total(scraped: dict[str, list[Any]], name: str, pool: str) -> float:
    """The sum over every worker of the samples called ``name`` of ``pool``."""
    return sum(s.value for _, s in samples(scraped, name, pool))


@pytest.mark.timeout(60)
def test_worker_metrics_count_every_put_ack_failure_and_run_of_a_pool(client, pools):
    name = f"m-{uuid.uuid4().hex[:6]}"
    qp = pools.queue(2, name=name, max_retries=0)
    cp = pools.consumer(qp)
    cp.start()
    qp.batch_submit([(tasks.double, i) for i in range(90)] + [(tasks.boom, i) for i in range(10)])
    cp.join(timeout=60)

    # The consumers count a batch just after the queue has recorded its outcome: wait for it.
    wait_until(lambda: total(scrape(client), "daskqueue_consumer_tasks_done_total", name) == 90, timeout_s=10)
    scraped = scrape(client)
    assert total(scraped, "daskqueue_queue_puts_total", name) == 100
    assert total(scraped, "daskqueue_queue_acks_total", name) == 90
    assert total(scraped, "daskqueue_queue_dead_letters_total", name) == 10
    assert total(scraped, "daskqueue_queue_dead_messages", name) == 10
    assert total(scraped, "daskqueue_queue_retries_total", name) == 0
    for gauge in ("ready_messages", "delayed_messages", "leased_messages"):
        assert total(scraped, f"daskqueue_queue_{gauge}", name) == 0, gauge
    assert total(scraped, "daskqueue_queue_bytes", name) > 10  # the dead letters' payloads
    # One series per queue, each on the worker holding it.
    queues = {s.labels["queue"]: addr for addr, s in samples(scraped, "daskqueue_queue_puts_total", name)}
    assert queues == {str(i): qp.queues[i]._address for i in qp.queue_indices}

    assert total(scraped, "daskqueue_consumer_tasks_failed_total", name) == 10
    assert total(scraped, "daskqueue_consumer_busy_slots", name) == 0
    assert total(scraped, "daskqueue_consumer_slots", name) == 2  # 2 consumers x max_concurrency 1
    consumers = samples(scraped, "daskqueue_consumer_tasks_done_total", name)
    assert sorted(s.labels["consumer"] for _, s in consumers) == ["0", "1"]
    assert all(s.labels["actor"].startswith("GeneralConsumer-") for _, s in consumers)
    # The duration histogram counts every run, failed or not; buckets are cumulative.
    assert total(scraped, "daskqueue_consumer_task_duration_seconds_count", name) == 100
    assert total(scraped, "daskqueue_consumer_task_duration_seconds_sum", name) > 0
    for addr, s in samples(scraped, "daskqueue_consumer_task_duration_seconds_bucket", name):
        if s.labels["le"] == "+Inf":
            count = [c for a, c in samples(scraped, "daskqueue_consumer_task_duration_seconds_count", name)
                     if a == addr and c.labels["actor"] == s.labels["actor"]]
            assert s.value == count[0].value
    inf = sum(s.value for _, s in samples(scraped, "daskqueue_consumer_task_duration_seconds_bucket", name)
              if s.labels["le"] == "+Inf")
    assert inf == 100


@pytest.mark.timeout(60)
def test_queued_messages_show_as_ready_with_their_payload_bytes(client, pools):
    name = f"m-{uuid.uuid4().hex[:6]}"
    qp = pools.queue(2, name=name)
    qp.batch_submit([(tasks.add, i, i) for i in range(40)])

    scraped = scrape(client)
    assert total(scraped, "daskqueue_queue_ready_messages", name) == 40
    assert total(scraped, "daskqueue_queue_bytes", name) > 40  # each payload is a few pickled bytes


@pytest.mark.timeout(60)
def test_a_consumer_without_a_queue_on_its_worker_is_labelled_with_its_pool_from_the_registry(client, pools):
    name = f"m-{uuid.uuid4().hex[:6]}"
    qp = pools.queue(1, name=name)  # 2 workers: one of the consumers has no queue beside it
    cp = pools.consumer(qp)
    cp.start()
    queue_worker = qp.queues[qp.queue_indices[0]]._address

    def labelled() -> list[tuple[str, Any]]:
        return samples(scrape(client), "daskqueue_consumer_tasks_done_total", name)

    # The registry is read in the background when a consumer starts: wait for it.
    wait_until(lambda: len(labelled()) == 2, timeout_s=10)
    assert {addr for addr, _ in labelled()} == set(client.scheduler_info()["workers"])
    assert any(addr != queue_worker for addr, _ in labelled())


def test_families_render_snapshots_as_labelled_gauges_counters_and_a_histogram():
    snap = {"address": "tcp://w:1", "queues": {"Q-1": {
        "index": 3, "pool": "p", "kind": "transient", "ready": 5, "delayed": 1, "leased": 2, "dead": 1,
        "bytes": None, "puts": 9, "acks": 5, "retries": 2, "expired": 0, "worker_lost": 0, "moved": 0,
        "dead_letters": 1, "purged": 0}},
        "consumers": {"C-1": {"index": 0, "pool": "p", "running": True, "slots": 2, "busy_slots": 1,
                              "done": 5, "failed": 2, "batches": 3, "duration_buckets": [1] * 11,
                              "duration_count": 7, "duration_sum_s": 0.5}}}
    fams = {f.name: f for f in metrics.families([snap])}
    assert fams["daskqueue_queue_ready_messages"].type == "gauge"
    assert [(s.labels, s.value) for s in fams["daskqueue_queue_ready_messages"].samples] == \
        [({"pool": "p", "queue": "3"}, 5)]
    assert fams["daskqueue_queue_acks"].type == "counter"
    assert fams["daskqueue_queue_bytes"].samples == []  # unknown (a compaction ran): left out
    hist = fams["daskqueue_consumer_task_duration_seconds"]
    assert hist.type == "histogram"
    les = [s.labels["le"] for s in hist.samples if s.name.endswith("_bucket")]
    assert les[0] == "0.001" and les[-1] == "+Inf" and len(les) == 12
    assert {s.labels["actor"] for s in hist.samples} == {"C-1"}


def test_ensure_registered_registers_once_and_never_raises(monkeypatch):
    from prometheus_client import REGISTRY

    def ours() -> int:
        return sum(isinstance(c, metrics.DaskQueueCollector) for c in list(REGISTRY._collector_to_names))

    metrics.ensure_registered()
    metrics.ensure_registered()
    assert ours() == 1
    # Without prometheus_client (a worker without it): no metrics, no error.
    monkeypatch.setattr(metrics, "_attempted", False)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    metrics.ensure_registered()
    assert metrics._attempted


def test_metrics_imports_no_actor_class():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(metrics))
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [m for m in modules if m and m.startswith(("daskqueue.queue", "daskqueue.consumer"))]


async def test_the_snapshot_shows_a_queue_by_its_public_sample_until_it_is_handed_off():
    from types import SimpleNamespace

    from daskqueue import TransientQueue
    from tests.queue.test_handoff import _raw_blob

    q = TransientQueue(3, pool="p")  # driven by hand, on this test's event loop
    await q.put_batch(_raw_blob([b"ab", b"cde"]))
    worker = SimpleNamespace(address="tcp://w:1", state=SimpleNamespace(actors={"Q-3": q, "other": object()}))
    row = metrics.snapshot(worker)["queues"]["Q-3"]
    assert (row["index"], row["pool"], row["kind"], row["ready"], row["puts"]) == (3, "p", "transient", 2, 2)
    assert row["bytes"] > 0 and "serving" not in row
    await q.hand_off()
    assert metrics.snapshot(worker)["queues"] == {}
