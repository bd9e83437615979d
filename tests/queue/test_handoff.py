"""A queue actor handing itself to a successor, and puts retried with their token: real queue
actors on the shared cluster, both kinds."""

from __future__ import annotations

import asyncio

import pytest

from daskqueue import DurableQueue, TransientQueue
from daskqueue.errors import QueueHandedOffError
from daskqueue.serialize import encode_put
from tests.helpers import wait_until
from tests.queue.test_contract import ack, get, put
from tests.segment.helpers import crash

TOKEN = b"0123456789ab"


@pytest.fixture(params=[TransientQueue, DurableQueue], ids=lambda k: k.kind)
def actor(request, client, tmp_path):
    """``actor(handoff=None)`` starts a queue actor; a durable one always on the same directory
    (but one named otherwise)."""
    made = []

    def make(directory: str = "q", **kwargs):
        args = (0,) if request.param is TransientQueue else (0, str(tmp_path / directory))
        future = client.submit(request.param, *args, actor=True, pure=False, **kwargs)
        made.append(future)
        return future.result()

    yield make
    for future in made:
        try:
            future.result().close().result()
        except Exception:
            pass


def test_a_successor_goes_on_with_the_leases_messages_results_and_dead_letters(actor):
    old = actor(max_retries=0)
    put(old, list(range(10)))
    held_id, held = get(old, n=3)  # running on a consumer during the hand-off
    dead_id, _ = get(old, n=1)
    ack(old, dead_id, 1, errors={0: b"E\x00boom\x00tb"})  # max_retries=0: dead at once
    done_id, _ = get(old, n=2)
    ack(old, done_id, 2)  # acked, result not fetched yet

    new = actor(max_retries=0, handoff=old.hand_off().result())

    with pytest.raises(QueueHandedOffError):
        old.stats().result()
    with pytest.raises(QueueHandedOffError):
        put(old, [99])
    ack(new, held_id, 3)  # the lease went with the queue: its settlement counts there
    _, rest = get(new, n=10)
    assert [(seq, item, attempts) for seq, item, attempts in rest] == [(k, k, 0) for k in range(6, 10)]
    stats = new.stats().result()
    assert (stats.ready, stats.leased, stats.dead) == (0, 4, 1)
    cursor, blob, dead_cursor, dead = new.fetch_outcomes(0, 0).result()
    assert dead_cursor == 1 and dead[0][0] == 3  # seq 3 was dead-lettered
    assert cursor >= 2  # the acked batches' result records, under the same numbering
    assert stats.total_retried == 0  # nothing that ran or was running comes back


def test_a_put_sent_again_with_its_token_is_stored_once(actor):
    q = actor()
    first = put(q, [1, 2, 3], token=TOKEN)
    again = put(q, [1, 2, 3], token=TOKEN)
    assert again == first
    assert q.stats().result().ready == 3
    other = put(q, [4], token=b"another-tokn")
    assert other[0][0] == 3


def test_a_put_token_survives_the_hand_off(actor):
    old = actor()
    first = put(old, [1, 2], token=TOKEN)
    new = actor(handoff=old.hand_off().result())
    assert put(new, [1, 2], token=TOKEN) == first
    assert new.stats().result().ready == 2


async def test_a_durable_put_token_survives_a_crash_and_a_compaction(tmp_path):
    q = DurableQueue(0, str(tmp_path / "q"))  # driven by hand, on this test's event loop
    blob = _raw_blob([1, 2, 3])
    first = await q.put_batch(blob, TOKEN)
    crash(q)
    q = DurableQueue(0, str(tmp_path / "q"))
    assert await q.put_batch(blob, TOKEN) == first
    await q.compact()
    crash(q)
    q = DurableQueue(0, str(tmp_path / "q"))
    assert await q.put_batch(blob, TOKEN) == first
    assert (await q.stats()).ready == 3
    await q.close()


def _raw_blob(items):
    from daskqueue.messages import Kind
    from daskqueue.serialize import Group, pack_payloads

    offsets, data = pack_payloads(items, max_message_bytes=2**20)
    return encode_put([Group(Kind.RAW, None, None, 0, None, 0.0, len(items), offsets, data)], {})



# -- two phases: a hand-off is provisional until the client confirms it ------------------------


def _serves(q) -> bool:
    try:
        q.stats().result()
        return True
    except QueueHandedOffError:
        return False


def test_an_aborted_hand_off_serves_again_with_its_messages_and_leases(actor):
    q = actor()
    put(q, [1, 2, 3])
    held, _ = get(q, n=1)  # running on a consumer during the hand-off
    q.hand_off().result()
    assert not _serves(q)
    assert q.handoff_abort().result() is True
    assert q.handoff_done().result() is False  # too late: the successor's copy is stale
    assert ack(q, held, 1) == (1, 0, 0, 0)
    assert [item for _, item, _ in get(q, n=10)[1]] == [2, 3]
    assert put(q, [4]) == [(3, 1)]  # storage is back too (a durable queue's directory)


def test_a_hand_off_neither_confirmed_nor_aborted_serves_again_after_the_bound(actor):
    confirmed, forgotten = actor(), actor(directory="q2")
    for q in (confirmed, forgotten):
        put(q, ["a", "b"])
        q.hand_off(0.5).result()
    assert confirmed.handoff_done().result() is True
    wait_until(lambda: _serves(forgotten), timeout_s=20)
    assert forgotten.stats().result().ready == 2
    assert not _serves(confirmed)  # its bound passed as well: done is final
    assert confirmed.handoff_abort().result() is False


async def test_an_abort_that_arrives_while_the_hand_off_runs_takes_effect_when_it_ends():
    q = TransientQueue(0)  # driven by hand, on this test's event loop
    await q.put_batch(_raw_blob([1, 2]))
    running = asyncio.ensure_future(q.hand_off())
    await asyncio.sleep(0)  # hand_off now waits for the sweeper to stop
    assert not running.done()
    assert await q.handoff_abort() is True
    await asyncio.wait_for(running, 10)
    assert (await q.stats()).ready == 2
    await q.close()


async def test_a_durable_queue_that_serves_again_writes_to_its_directory_as_before(tmp_path):
    q = DurableQueue(0, str(tmp_path / "q"))  # driven by hand, on this test's event loop
    await q.put_batch(_raw_blob([1, 2]))
    await q.hand_off()
    assert await q.handoff_abort() is True
    await q.put_batch(_raw_blob([3]))
    await q.close()
    q = DurableQueue(0, str(tmp_path / "q"))
    assert (await q.stats()).ready == 3
    await q.close()


async def test_a_durable_queue_whose_successor_holds_the_directory_stays_handed_off(tmp_path):
    q = DurableQueue(0, str(tmp_path / "q"))
    await q.put_batch(_raw_blob([1]))
    successor = DurableQueue(0, str(tmp_path / "q"), handoff=await q.hand_off())
    assert await q.handoff_abort() is False  # its directory is the successor's now
    with pytest.raises(QueueHandedOffError):
        await q.stats()
    assert (await successor.stats()).ready == 1
    await successor.close()


def test_a_successor_keeps_the_given_ids_of_attached_producers_adopted_runs():
    """Review finding 7: the ids attached producers were given for messages moved here went
    with a hand-off's state no more, so a later move named this queue's seqs instead."""
    import asyncio

    from daskqueue.queue.transient import TransientQueue

    async def main():
        old = TransientQueue(1)
        old._adopted.add(100, 10, 0, 7)  # seqs 100.. here were given as queue 0's 7..
        successor = TransientQueue(1, handoff=await old.hand_off())
        assert successor._adopted.given(1, 105) == (0, 12)
        await successor.close()

    asyncio.run(main())
