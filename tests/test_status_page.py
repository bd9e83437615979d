"""The status page on the scheduler's HTTP server (rendered by a real headless Chromium), its
JSON route, and the bounded HTML tables of pools for notebooks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from typing import Any

import pytest

from daskqueue import status
from daskqueue.consumer.base import ConsumerStats
from daskqueue.queue.base import QueueStats
from daskqueue.registry import CONSUMERS_KEY, POOLS_KEY
from tests import tasks


def cell(html: str, column: str, index: str) -> str:
    """The text of the ``column`` cell of the row ``data-index=index`` (first table having it)."""
    row = re.search(rf'<tr class="[^"]*" data-index="{index}">(.*?)</tr>', html, re.S)
    assert row, f"no row {index} in {html[:2000]}"
    found = re.search(rf'data-col="{column}">([^<]*)<', row.group(1))
    assert found, f"no column {column} in row {index}: {row.group(1)}"
    return found.group(1)


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read().decode())


# -- the page on a real cluster ----------------------------------------------------------------


@pytest.mark.timeout(60)
def test_status_page_shows_each_pools_queued_messages_in_a_headless_browser(client, pools):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium binary on PATH (apt-get install -y chromium) to render the page")
    name = f"page-{uuid.uuid4().hex[:6]}"
    qp = pools.queue(2, name=name)
    pools.consumer(qp)  # not started: the messages stay queued, the consumers idle
    qp.batch_submit([(tasks.add, i, i) for i in range(30)])
    url = status.install(client)
    assert status.install(client) == url  # idempotent
    assert url.endswith("/daskqueue")

    data = get_json(url + "/status.json")
    pool = next(p for p in data["pools"] if p["name"] == name)
    assert [q["state"] for q in pool["queues"]] == ["ok", "ok"]
    assert sum(q["ready"] for q in pool["queues"]) == 30
    assert all(q["bytes"] > 0 for q in pool["queues"])
    assert [(c["state"], c["done"], c["running"]) for c in pool["consumers"]] == [("ok", 0, False)] * 2

    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url],
                         capture_output=True, text=True, timeout=60).stdout
    section = dom[dom.index(f'data-pool="{name}"'):]
    section = section[: section.index("</div>")]
    assert f"<code>{name}</code>" in section
    ready = [int(cell(section, "ready", str(i))) for i in qp.queue_indices]
    assert sum(ready) == 30 and ready == [q["ready"] for q in pool["queues"]]
    assert cell(section, "ready", "total") == "30"
    assert cell(section, "puts", "total") == "30"
    assert int(cell(section, "bytes", "total").replace(",", "")) == sum(q["bytes"] for q in pool["queues"])
    assert '<meta http-equiv="refresh"' in dom


@pytest.mark.timeout(60)
def test_pool_html_and_consumer_pool_html_show_live_counts(client, pools):
    qp = pools.queue(2, name=f"nb-{uuid.uuid4().hex[:6]}")
    cp = pools.consumer(qp)
    qp.batch_submit([(tasks.add, i, i) for i in range(10)])

    html = status.pool_html(qp, timeout_s=5)
    assert f"<code>{qp.name}</code>" in html
    assert cell(html, "ready", "total") == "10"
    assert "unreachable" not in html
    chtml = status.consumer_pool_html(cp, timeout_s=5)
    assert [cell(chtml, "done", i) for i in ("0", "1")] == ["0", "0"]
    assert cell(chtml, "slots", "total") == "2"


# -- deadlines: nothing waits on a queue that does not answer -----------------------------------


class Answering:
    """A handle whose ``stats()`` answers at once."""

    def __init__(self, stats: Any, address: str = "tcp://a:1") -> None:
        self._stats, self._address = stats, address

    def stats(self) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(self._stats)
        return future


class Silent:
    """A handle whose ``stats()`` never answers (its worker hangs)."""

    _address = "tcp://hung:1"

    def stats(self) -> concurrent.futures.Future:
        return concurrent.futures.Future()


def queue_stats(index: int, ready: int) -> QueueStats:
    return QueueStats(index=index, kind="transient", ready=ready, delayed=0, leased=0, dead=0, total_put=ready,
                      total_acked=0, total_retried=0, total_expired=0, total_worker_lost=0, get_calls=0,
                      closed=False)


class FakeQueuePool:
    def __init__(self, handles: dict[int, Any]) -> None:
        self.name, self.durability, self._closed = "fake", "transient", False
        self.queues, self.queue_indices = handles, sorted(handles)


@pytest.mark.timeout(10)
def test_pool_html_shows_a_queue_that_does_not_answer_as_unreachable_within_its_timeout():
    silent = dict.fromkeys(range(1, 7), Silent())
    qp = FakeQueuePool({0: Answering(queue_stats(0, 7)), **silent, 7: Answering(queue_stats(7, 5))})
    t0 = time.monotonic()
    html = status.pool_html(qp, timeout_s=0.5)
    elapsed = time.monotonic() - t0
    # One deadline for all, not 0.5 s per silent queue (3 s for six); 1.5 s of slack for a
    # loaded machine.
    assert elapsed < 2.0
    assert [cell(html, "ready", i) for i in ("0", "7")] == ["7", "5"]
    assert html.count('class="unreachable"') == 6
    assert cell(html, "ready", "total") == "12"  # the queues that answered


@pytest.mark.timeout(10)
def test_consumer_pool_html_shows_a_consumer_that_does_not_answer_as_unreachable():
    stats = ConsumerStats(index=4, running=True, batches=2, items_done=9, items_failed=1, inflight_items=0,
                          batch_size=1, refused_settlements=0, fetch_calls=3, busy_slots=1,
                          duration_count=10, duration_sum_s=0.02)

    class FakeConsumerPool:
        consumers = [Answering(stats), Silent()]
        _options = {"max_concurrency": 2}

    t0 = time.monotonic()
    html = status.consumer_pool_html(FakeConsumerPool(), timeout_s=0.3)
    assert time.monotonic() - t0 < 3.0  # the silent one is given up, not waited for
    assert (cell(html, "done", "4"), cell(html, "failed", "4"), cell(html, "busy_slots", "4")) == ("9", "1", "1")
    assert cell(html, "mean_task_ms", "4") == "2"
    assert 'class="unreachable"' in html


class FakeScheduler:
    """What :func:`status.collect_status` uses of a scheduler: the registry, the workers and
    an RPC whose ``daskqueue_status`` answers from ``answers`` (None: never answers)."""

    def __init__(self, metadata: dict[str, Any], answers: dict[str, Any]) -> None:
        self.metadata, self.answers = metadata, answers
        self.workers = dict.fromkeys(answers)

    def get_metadata(self, keys: list[str], default: Any = None) -> Any:
        return self.metadata.get(keys[0], default)

    def rpc(self, address: str) -> Any:
        answer = self.answers[address]

        class Rpc:
            async def daskqueue_status(self) -> Any:
                if answer is None:
                    await asyncio.sleep(3600)
                return answer

        return Rpc()


@pytest.mark.timeout(10)
async def test_collect_status_marks_a_silent_or_departed_worker_unreachable_within_the_timeout():
    q = ("daskqueue.queue.transient:TransientQueue",)
    metadata = {
        POOLS_KEY: {"p": {"name": "p", "durability": "transient", "queues": {
            "0": [*q, "tcp://ok:1", "Q0"], "1": [*q, "tcp://hung:1", "Q1"], "2": [*q, "tcp://left:1", "Q2"],
            "3": [*q, "tcp://ok:1", "Q3"]}}, "closed": None},
        CONSUMERS_KEY: {"p": {"cp1": [["x:C", "tcp://ok:1", "C0"]]}},
    }
    row = {"index": 0, "pool": "p", "ready": 4, "delayed": 0, "leased": 1, "dead": 0, "bytes": 99, "puts": 5,
           "acks": 0, "retries": 0}
    crow = {"index": 0, "pool": "p", "running": True, "slots": 1, "busy_slots": 1, "done": 3, "failed": 0,
            "batches": 1, "duration_count": 3, "duration_sum_s": 0.3}
    answers = {"tcp://ok:1": {"address": "tcp://ok:1", "queues": {"Q0": row}, "consumers": {"C0": crow}},
               "tcp://hung:1": None}
    t0 = time.monotonic()
    pools = await status.collect_status(FakeScheduler(metadata, answers), timeout_s=0.3)
    assert time.monotonic() - t0 < 3.0  # the hung worker is given up, not waited for (an hour)
    assert [p["name"] for p in pools] == ["p"]  # the closed pool's entry (None) is left out
    states = [(r["index"], r["state"]) for r in pools[0]["queues"]]
    assert states == [(0, "ok"), (1, "unreachable"), (2, "unreachable"), (3, "gone")]
    assert "did not answer" in pools[0]["queues"][1]["error"]
    assert "left the cluster" in pools[0]["queues"][2]["error"]
    assert pools[0]["consumers"][0]["done"] == 3

    page = status.render_page(pools, generated_at=0)
    assert '<code>p</code>' in page and '<meta http-equiv="refresh" content="2">' in page
    assert cell(page, "ready", "0") == "4" and cell(page, "bytes", "0") == "99"
    assert cell(page, "ready", "total") == "4"  # only what answered is summed
    assert page.count('class="unreachable"') == 2 and 'class="gone"' in page


def test_render_page_without_pools_says_so():
    assert "No daskqueue pools" in status.render_page([])
