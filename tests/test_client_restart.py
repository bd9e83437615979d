"""The client process dies (a notebook kernel restarted, a script killed) while its pools
run; a new client on the same cluster carries on. A real client process, killed with SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

from distributed import Client, LocalCluster

from daskqueue import ConsumerPool, QueuePool
from tests.helpers import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLIENT = textwrap.dedent("""
    import sys, time
    from distributed import Client
    from daskqueue import ConsumerPool, QueuePool
    from tests import tasks

    client = Client(sys.argv[1])
    if sys.argv[3] == "idle":  # a pool that never got a call: its queue must close all the same
        QueuePool(client, 1, durability="durable", dirpath=sys.argv[2])
        print("", flush=True)
        time.sleep(120)
    qp = QueuePool(client, 2, durability="durable", dirpath=sys.argv[2])
    cp = ConsumerPool(client, qp)
    cp.start()
    # 5 s of work on two consumers: most of it is left at the kill, for the next client.
    ids = qp.batch_submit([(tasks.sleep_then, i, 0.01) for i in range(1000)])
    while sum(s.total_acked for s in qp.stats()) < 200:
        time.sleep(0.05)
    print(" ".join(map(str, ids)), flush=True)
    time.sleep(120)
""")


def _client_killed_after_its_first_line(cluster, dirpath, mode: str) -> str:
    """Run the client script (``mode`` "busy" or "idle") until it prints its first line,
    then SIGKILL it, as a restarted kernel or preemption would; return that line."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    first = subprocess.Popen([sys.executable, "-c", CLIENT, cluster.scheduler_address, str(dirpath), mode],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        return first.stdout.readline()
    finally:
        first.kill()
        first.wait(timeout=30)


def _consumer_threads(client):
    names = client.run(lambda: [t.name for t in threading.enumerate()])
    return [n for ns in names.values() for n in ns if n.startswith("daskqueue-consumer")]


def test_a_new_client_reopens_a_durable_pool_whose_client_was_killed_and_gets_every_result(tmp_path):
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        ids = [int(i) for i in _client_killed_after_its_first_line(cluster, tmp_path / "pool", "busy").split()]
        assert len(ids) == 1000

        # The old pool's actors close themselves once their worker releases them: their
        # threads end and the queues' directory locks are free for the new pool.
        wait_until(lambda: not _consumer_threads(client), timeout_s=30)
        qp = QueuePool(client, 2, durability="durable", dirpath=tmp_path / "pool")
        cp = ConsumerPool(client, qp)
        cp.start()
        cp.join(timeout=120)

        # Results the dead client never fetched are on disk too: one value per task.
        results = cp.results()
        assert sorted(results[i] for i in ids) == list(range(1000))
        assert cp.failures() == {}
        cp.close()
        qp.close()


def test_a_pool_that_never_got_a_call_lets_go_of_its_directory_when_its_client_dies(tmp_path):
    import time

    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        _client_killed_after_its_first_line(cluster, tmp_path / "pool", "idle")
        started = time.monotonic()
        qp = QueuePool(client, 1, durability="durable", dirpath=tmp_path / "pool")
        assert time.monotonic() - started < 15  # not StoreLockedError after the 8 s wait
        qp.close()
