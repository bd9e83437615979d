"""The default ``n_queues`` of a ``QueuePool`` follows the cluster's worker threads (the scale
model of benchmarks/README.md, issue 24; the rule itself: tests/queue/test_config.py)."""

from __future__ import annotations

import pytest

from daskqueue import ConsumerPool, QueuePool
from daskqueue.queue.config import default_n_queues


@pytest.mark.timeout(120)
def test_a_pool_without_n_queues_gets_the_models_count_for_its_cluster(cluster_factory, tmp_path):
    # 26 workers of 1 thread (in one process, so the test stays light): 26 slots make 2 queues
    _, client = cluster_factory(26, processes=False)
    client.wait_for_workers(26, timeout=60)
    assert default_n_queues(26) == 2
    qp = QueuePool(client)
    cp = None
    try:
        assert qp.n_queues == 2
        cp = ConsumerPool(client, qp, n_consumers=2, isolation="thread")
        cp.start()
        assert qp.map(abs, range(-50, 50)) == [abs(i) for i in range(-50, 50)]
    finally:
        if cp is not None:
            cp.close()
        qp.close()
    # a durable pool's count is on its disk: the default stays 1, and n_queues= still wins
    durable = QueuePool(client, durability="durable", dirpath=tmp_path / "pool")
    try:
        assert durable.n_queues == 1
    finally:
        durable.close()
    three = QueuePool(client, 3)
    try:
        assert three.n_queues == 3
    finally:
        three.close()
