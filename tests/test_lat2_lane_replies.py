"""The lane's held put answers (``daskqueue/queue/lane_replies.py``): submit's put answer
travels with the outcome of the poll that came with it, and is never held past its bound."""

from __future__ import annotations

import asyncio

import pytest

from daskqueue.errors import JoinTimeoutError
from daskqueue.queue import lane_connection
from daskqueue.queue.lane_replies import Replies
from tests import tasks
from tests.helpers import wait_until


def _replies():
    written: list[bytes] = []
    return Replies(written.append), written


@pytest.mark.timeout(10)
def test_a_paired_put_answer_goes_out_with_its_polls_answer():
    async def main():
        replies, written = _replies()
        replies.pair(1, 2)
        replies.send(1, b"put", may_hold=True)
        assert written == []
        replies.send(2, b"poll", may_hold=False)
        assert written == [b"putpoll"]
        await asyncio.sleep(0.01)  # the cancelled hold writes nothing more
        assert written == [b"putpoll"]

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_a_put_without_a_poll_of_its_own_or_a_failed_one_is_answered_at_once():
    async def main():
        replies, written = _replies()
        replies.send(1, b"lone put", may_hold=True)
        replies.pair(3, 4)
        replies.send(3, b"error", may_hold=False)
        replies.pair(5, 6)
        replies.send(6, b"poll first", may_hold=False)
        replies.send(5, b"put after its poll", may_hold=True)
        assert written == [b"lone put", b"error", b"poll first", b"put after its poll"]

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_a_held_answer_is_written_when_the_hold_runs_out_or_on_flush(monkeypatch):
    from daskqueue.queue import lane_replies

    monkeypatch.setattr(lane_replies, "PUT_HOLD_S", 0.01)

    async def main():
        replies, written = _replies()
        replies.pair(1, 2)
        replies.send(1, b"put", may_hold=True)
        await asyncio.sleep(0.1)
        assert written == [b"put"]
        replies.send(2, b"poll", may_hold=False)
        replies.pair(3, 4)
        replies.send(3, b"put2", may_hold=True)
        replies.flush()
        assert written == [b"put", b"poll", b"put2"]

    asyncio.run(main())


def _set_hold(client, seconds):
    def set_it(seconds=seconds):
        from daskqueue.queue import lane_replies

        old = lane_replies.PUT_HOLD_S
        lane_replies.PUT_HOLD_S = seconds
        return old

    return set(client.run(set_it).values())


@pytest.mark.timeout(120)
def test_submit_then_result_reads_both_answers_in_one_read(pools, client, monkeypatch):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    wait_until(lambda: cp.result(qp.submit(tasks.double, 1), timeout=30) == 2 and qp.queues[0].lane_peer(),
               timeout_s=30)
    reads: list[int] = []
    real = lane_connection.LaneConnection._read_frames

    def counting(self, deadline):
        frames = real(self, deadline)
        reads.append(len(frames))
        return frames

    monkeypatch.setattr(lane_connection.LaneConnection, "_read_frames", counting)
    (old,) = _set_hold(client, 60.0)  # no hold runs out here, however slow the machine
    try:
        for i in range(3):
            reads.clear()
            assert cp.result(qp.submit(tasks.double, i), timeout=30) == 2 * i
            assert reads == [2], reads  # put answer and outcome: one read, one wake-up
    finally:
        _set_hold(client, old)


@pytest.mark.timeout(120)
def test_a_held_put_answer_does_not_wait_for_a_long_task(pools, client):
    qp = pools.queue(1)
    cp = pools.consumer(qp, n_consumers=1, isolation="thread")
    cp.start()
    wait_until(lambda: cp.result(qp.submit(tasks.double, 1), timeout=30) == 2 and qp.queues[0].lane_peer(),
               timeout_s=30)
    (old,) = _set_hold(client, 0.05)
    try:
        tid = qp.submit(tasks.sleep_then, 7, 5.0)
        with pytest.raises(JoinTimeoutError):  # submit returned while the task still runs
            cp.result(tid, timeout=0.01)
        assert cp.result(tid, timeout=60) == 7
    finally:
        _set_hold(client, old)
