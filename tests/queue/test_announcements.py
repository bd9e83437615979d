"""Work announcements between queue actors driven by hand (off a worker a peer is the actor
object itself): a queue's successor is heard by its peers however its clock compares."""

from __future__ import annotations

from daskqueue.queue.transient import TransientQueue
from tests.helpers import wait_until_async
from tests.queue.test_handoff import _raw_blob


async def test_a_successor_numbering_below_its_predecessor_is_told_so_and_is_heard():
    survivor, before = TransientQueue(0), TransientQueue(1)
    after = TransientQueue(1)
    try:
        await survivor.set_peers([survivor, before])
        await before.set_peers([survivor, before])
        await before.put_batch(_raw_blob([1, 2, 3]))
        await wait_until_async(lambda: 1 in survivor._board.work_at, timeout_s=10)
        await before.close()  # its worker died
        predecessors_last = survivor._board.last_heard(1)

        # A successor whose clock is far behind: its numbers start below the predecessor's last.
        after._board.number = 5
        await after.set_peers([survivor, after])
        await after.put_batch(_raw_blob([1, 2, 3]))
        survivor._board.forget_work([1])  # the pool's workers_lost
        await survivor.set_peers([survivor, after])  # tells `after` what it heard from index 1
        await wait_until_async(lambda: 1 in survivor._board.work_at, timeout_s=10)
        assert survivor._board.last_heard(1) > predecessors_last  # the successor's, numbered on above
    finally:
        for q in (survivor, before, after):
            await q.close()
