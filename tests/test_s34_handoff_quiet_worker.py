"""Calls that come late to a queue's old actor, after the queue moved on and the pool freed
that actor, do not make its worker log a traceback.

Dask's ``actor_execute`` looks the actor up outside its ``try``: every call that reached the
worker after it had dropped the actor logged "Exception while handling op actor_execute" and
a ``KeyError`` traceback (``distributed.core``, which ``client.get_worker_logs()`` does not
show: the test reads that logger on the worker). The pool's handle of a freed actor now
answers such calls itself (``ActorReleasedError``, read as "moved" by the pool) without
sending them. As in tests/test_s33_released_after_move.py, calls through the old handle
stand for calls made before the move that are carried out only now."""

from __future__ import annotations

import logging

import pytest

from daskqueue.errors import QueueHandedOffError
from daskqueue.queue.table import Pending
from tests.helpers import wait_until

CORE = "distributed.core"


def _watch_core_log(dask_worker):
    """Keep what ``distributed.core`` logs at ERROR on this worker (read by ``_core_errors``)."""
    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.ERROR)
            self.lines = []

        def emit(self, record):
            self.lines.append(self.format(record))

    dask_worker._s34_core_errors = Keep()
    logging.getLogger(CORE).addHandler(dask_worker._s34_core_errors)


def _core_errors(dask_worker):
    return list(dask_worker._s34_core_errors.lines)


def _unwatch_core_log(dask_worker):
    logging.getLogger(CORE).removeHandler(dask_worker._s34_core_errors)
    del dask_worker._s34_core_errors


def _holds(client, handle) -> bool:
    key = handle.key
    held = client.run(lambda dask_worker: key in dask_worker.state.actors, workers=[handle._address])
    return bool(held.get(handle._address))


@pytest.mark.timeout(90)
def test_late_calls_to_a_queue_actor_freed_after_its_hand_off_leave_its_worker_log_clean(client, pools):
    qp = pools.queue(1)
    old = qp.queues[0]
    where = old._address
    client.run(_watch_core_log, workers=[where])
    try:
        qp.follower.hand_off(0)
        assert qp.queues[0]._address != where
        wait_until(lambda: not _holds(client, old), timeout_s=30)
        old.__dict__["_future"] = None  # calls made before the move, carried out only now
        table = qp.table
        for method, args in (("stats", ()), ("fetch_outcomes", (0, 0, 0.0)), ("dead_letters", (None,))):
            with pytest.raises(QueueHandedOffError):
                table.answer(0, Pending(getattr(old, method)(*args), old, method, args))
        assert table.answer_or_ask_again(0, Pending(old.stats(), old, "stats", ())).index == 0
        errors = client.run(_core_errors, workers=[where])[where]
        assert not [e for e in errors if "actor_execute" in e or "KeyError" in e], errors
    finally:
        client.run(_unwatch_core_log, workers=[where])
