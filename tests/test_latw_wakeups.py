"""One task's path inside the queue's worker (issue 24): who runs first on the event loop.

Queue actors and helpers driven by hand on a plain asyncio loop (no cluster): what is tested
is the order of the loop's steps, which a cluster would only blur.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from daskqueue import TransientQueue
from daskqueue.consumer.eager import start_eagerly
from daskqueue.messages import Kind
from daskqueue.serialize import Group, decode_delivery, encode_put, encode_settle, pack_payloads


def put_blob(items: list) -> bytes:
    offsets, data = pack_payloads(items, max_message_bytes=2**20)
    return encode_put([Group(Kind.RAW, None, None, 0, None, 0.0, len(items), offsets, data)], {})


@pytest.mark.timeout(30)
def test_a_put_answers_after_the_long_poll_it_woke_took_the_work():
    """The put's answer (a socket write, slow after an idle gap) comes after the waiting
    long poll has leased the message: the consumer's path starts first."""

    async def main() -> None:
        q = TransientQueue(0)
        try:
            getter = asyncio.ensure_future(q.get_batch(10, 5.0))
            await asyncio.sleep(0.01)  # the poll waits
            assert await q.put_batch(put_blob(["a"])) == [(0, 1)]
            assert getter.done()
            lease_id, _, segments = decode_delivery(getter.result())
            assert sum(s.count for s in segments) == 1
        finally:
            await q.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_a_put_with_no_long_poll_waiting_answers_without_yielding():
    """No poll waits: the put answers on its own step (nothing to let go first)."""

    async def main() -> None:
        q = TransientQueue(0)
        try:
            ran = []
            asyncio.get_running_loop().call_soon(ran.append, True)
            assert await q.put_batch(put_blob(["a"])) == [(0, 1)]
            assert ran == []  # the loop did not get a round in between
        finally:
            await q.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_start_eagerly_runs_up_to_the_first_suspension_at_once():
    async def main() -> None:
        steps = []
        gate = asyncio.get_running_loop().create_future()

        async def work() -> str:
            steps.append("started")
            value = await gate
            steps.append("resumed")
            return value + "!"

        task = start_eagerly(work())
        assert steps == ["started"]  # before this coroutine yielded to the loop
        gate.set_result("done")
        assert await task == "done!"
        assert steps == ["started", "resumed"]

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_start_eagerly_of_a_coroutine_that_never_waits_is_done_at_once():
    async def main() -> None:
        async def quick() -> int:
            return 7

        async def broken() -> None:
            raise ValueError("boom")

        fut = start_eagerly(quick())
        assert fut.done() and fut.result() == 7
        failed = start_eagerly(broken())
        assert failed.done()
        with pytest.raises(ValueError, match="boom"):
            await failed

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_start_eagerly_passes_exceptions_and_cancellation_on_to_the_coroutine():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen = []

        async def fails_later() -> None:
            await asyncio.sleep(0)
            raise KeyError("late")

        async def waits_for_good() -> None:
            try:
                await loop.create_future()
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            finally:
                seen.append("cleaned up")

        with pytest.raises(KeyError):
            await start_eagerly(fails_later())
        task = start_eagerly(waits_for_good())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled", "cleaned up"]

        async def inner_waits() -> str:
            # An awaited task and a sleep inside: the loop sees the same futures as without.
            await asyncio.sleep(0.01)
            return await asyncio.ensure_future(asyncio.sleep(0.01, result="slept"))

        assert await start_eagerly(inner_waits()) == "slept"

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_a_lease_due_after_the_sweepers_own_wakeup_does_not_wake_it_and_a_sooner_one_does():
    """The sweeper wakes at least every ORPHAN_CHECK_S for its chores: a lease due later
    needs no wake-up now (one round of the loop less on a task's path), one due sooner gets
    it, and expires on time."""

    async def main() -> None:
        q = TransientQueue(0, lease_timeout_s=30.0)
        short = TransientQueue(1, lease_timeout_s=0.3)
        try:
            for queue in (q, short):
                await queue.put_batch(put_blob(["a"]))
            await asyncio.sleep(0.05)  # both sweepers asleep, until their chores are due
            assert not q._timer_changed.is_set()  # noqa: SLF001
            assert await q.get_batch(1) is not None
            assert not q._timer_changed.is_set()  # noqa: SLF001
            first = await short.get_batch(1)
            assert short._timer_changed.is_set()  # noqa: SLF001
            again = await short.get_batch(1, 5.0)  # redelivered once the lease expired
            assert decode_delivery(again)[2][0].attempts == decode_delivery(first)[2][0].attempts + 1
        finally:
            await q.close()
            await short.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_work_a_waiting_long_poll_takes_is_never_announced_to_the_peers():
    """A put woke this queue's own long poll, which leases it: the peers hear nothing (no
    announcer task made as the poll's wait ends, before it leased)."""

    async def main() -> None:
        home, peer = TransientQueue(0), TransientQueue(1)
        try:
            await home.set_peers([home, peer])
            await peer.set_peers([home, peer])
            getter = asyncio.ensure_future(home.get_batch(10, 5.0))
            await asyncio.sleep(0.05)
            await home.put_batch(put_blob(["a"]))
            assert decode_delivery(await getter)[2][0].count == 1
            assert home._announcer is None  # noqa: SLF001
            await asyncio.sleep(0.1)
            assert 0 not in peer._board.work_at  # noqa: SLF001
            # With nobody waiting here, new work is announced as before.
            await home.put_batch(put_blob(["b"]))
            deadline = asyncio.get_running_loop().time() + 5
            while 0 not in peer._board.work_at:  # noqa: SLF001
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
        finally:
            await home.close()
            await peer.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_work_after_an_idle_spell_wakes_the_sweeper_for_its_load_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool's queue reports its backlog (what ``adapt`` scales on) within LOAD_REPORT_S of
    work appearing: a put to a queue that had reported itself idle wakes the sweeper, which
    otherwise sleeps until its next chore (up to ORPHAN_CHECK_S; the churn benchmark's
    scale-up took 4.4 s instead of 0.8-1.6 s)."""
    from daskqueue.queue import sweeper

    monkeypatch.setattr(sweeper, "LOAD_REPORT_S", 0.05)
    monkeypatch.setattr(sweeper, "LOAD_CONFIRM_S", 0.05)
    monkeypatch.setattr(sweeper, "ORPHAN_CHECK_S", 60.0)  # the sweeper's one far chore

    async def until(cond: Callable[[], bool], within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while not cond():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    async def main() -> None:
        q = TransientQueue(0, lease_timeout_s=30.0)
        q.pool = "p"  # a pool's queue reports its load (off a worker the report is only noted)
        try:
            await q.put_batch(put_blob(["a"]))
            lease_id = decode_delivery(await q.get_batch(1))[0]
            assert await until(lambda: q._reported_work, 5.0)  # noqa: SLF001  # its work was reported
            await q.settle(lease_id, encode_settle(1, {}, set(), None))
            assert not q._reported_work  # noqa: SLF001  # and that it has none left
            # The sweeper asleep until its next chore, the orphan check a minute away (waited
            # for, not slept: on a loaded machine its last timed wakeup may still be due).
            assert await until(lambda: q._sweep_at is not None  # noqa: SLF001
                               and q._sweep_at > time.monotonic() + 30, 5.0)  # noqa: SLF001
            await q.put_batch(put_blob(["b"]))
            # Reported within seconds, not at the chore a minute away.
            assert await until(lambda: q._reported_work, 5.0)  # noqa: SLF001
        finally:
            await q.close()

    asyncio.run(main())
