"""A consumer pool closed right after a worker died, before the pool heard of it through its
membership thread: it asks the scheduler which workers are gone, does not wait for (or warn
of) the consumer lost there, tells the others, and returns within seconds.

Before, ``close`` called the dead consumer too: the call failed (``closing consumers failed:
OSError: Unable to contact Actor's worker``, and the scheduler logged an error), or, when it
needed a new connection to the dead address, waited out ``STOP_TIMEOUT_S`` (25 s); and the
other consumers' calls to the dead worker's queue, never told of the loss (closing drops the
membership change the pool has not reacted to), waited out their 20 s deadline.

The workers are ``dask worker`` jobs of their own (nanny and worker, one process group each),
so that killing one's group leaves nothing to restart it, as a batch system's kill does.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest
from distributed import Client

from daskqueue import ConsumerPool, QueuePool
from tests.helpers import job_of, wait_until

#: Well under the 20-25 s a call to a dead worker may wait, and well over what close takes.
BOUND_S = 8.0



def _pools(client: Client) -> tuple[QueuePool, ConsumerPool, str]:
    """A queue and a started consumer on each of the two workers; the second one's address."""
    qp = QueuePool(client, 2)
    cp = ConsumerPool(client, qp, isolation="thread")  # one consumer per worker
    cp.start()
    victim = qp.queues[1]._address
    assert qp.queues[0]._address != victim and victim in {h._address for h in cp.consumers}
    # The consumers are idle: each long-polls the queues, the victim's among them.
    assert sorted(qp.map(abs, [-1, -2, -3], timeout_s=30)) == [1, 2, 3]
    return qp, cp, victim


def _alarming(records: list[logging.LogRecord]) -> list[str]:
    """Warnings and errors but the pools' own reports of the loss (their membership thread)."""
    return [f"{r.name}: {r.getMessage()}" for r in records
            if r.levelno >= logging.WARNING and r.name.split(".")[0] in ("daskqueue", "distributed")
            and "was lost with its worker" not in r.getMessage()]


@pytest.mark.timeout(90)
def test_closing_a_consumer_pool_right_after_a_worker_died_skips_its_consumer_and_warns_of_nothing(jobs, caplog):
    client, procs = jobs(2)
    qp, cp, victim = _pools(client)
    job = job_of(client, procs, victim)
    try:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            # At once: the pool has not heard of the loss yet (its membership thread has not
            # told the consumers), and closing drops the change it has not reacted to.
            os.killpg(job.pid, signal.SIGKILL)
            started = time.monotonic()
            cp.close()
            took = time.monotonic() - started
        job.wait(timeout=30)
        assert took < BOUND_S, f"close took {took:.1f} s"
        assert not _alarming(caplog.records), _alarming(caplog.records)
    finally:
        cp.close()
        wait_until(lambda: victim in qp.lost_addresses(), timeout_s=30)  # so qp.close skips it
        qp.close()


@pytest.mark.timeout(90)
def test_a_consumer_pool_made_right_after_a_worker_died_starts_on_the_others_within_seconds(jobs):
    # The pool's view of the cluster is a moment behind: it places a consumer on the dead
    # worker too, which never starts there (one per worker is bound to its worker).
    client, procs = jobs(2)
    qp = QueuePool(client, 2)
    victim = qp.queues[1]._address
    [survivor] = {h._address for h in qp.queues} - {victim}
    job = job_of(client, procs, victim)
    cp = None
    try:
        os.killpg(job.pid, signal.SIGKILL)
        started = time.monotonic()
        cp = ConsumerPool(client, qp, isolation="thread")  # one consumer per worker
        took = time.monotonic() - started
        job.wait(timeout=30)
        assert took < BOUND_S, f"making the pool took {took:.1f} s"
        assert [h._address for h in cp.consumers] == [survivor]
    finally:
        if cp is not None:
            cp.close()
        wait_until(lambda: victim in qp.lost_addresses(), timeout_s=30)
        qp.close()
