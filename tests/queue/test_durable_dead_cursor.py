"""A client's dead-letter cursor stays valid across a durable reopen: dead letters keep their
ordinals, and one dead-lettered at the reopen (a message on its last attempt whose worker
died) gets an ordinal past every one handed out before, so the client fetches it."""

from __future__ import annotations

from tests.segment.helpers import crash, get, open_queue, put, settle


async def fetch_dead_seqs(q, cursor):
    end, dead = await q.fetch_dead(cursor)
    return end, [seq for seq, _, _, _ in dead]


async def a_dead_letter_then_a_running_last_attempt(q):
    """Dead-letter message 0 and fetch it (the client's cursor moves past it), then lease
    message 1 on its last attempt: ``(cursor, seq running)``."""
    await put(q, ["fails", "runs when the worker dies"])
    lease, items = await get(q, 1)
    await settle(q, lease, 1, {0: b"ValueError\x00bad\x00tb"})
    cursor, seqs = await fetch_dead_seqs(q, 0)
    assert seqs == [items[0][0]]
    lease, items = await get(q, 1)
    return cursor, items[0][0]


async def test_a_dead_letter_made_at_reopen_is_fetched_from_the_clients_cursor(tmp_path):
    q = open_queue(tmp_path, max_retries=0)
    cursor, running = await a_dead_letter_then_a_running_last_attempt(q)
    crash(q)
    q = open_queue(tmp_path, max_retries=0)  # rule 6: the running message is dead now
    end, seqs = await fetch_dead_seqs(q, cursor)
    assert seqs == [running] and end > cursor
    assert await fetch_dead_seqs(q, end) == (end, [])
    await q.close()


async def test_ordinals_survive_a_compaction_and_a_reopen(tmp_path):
    q = open_queue(tmp_path, max_retries=0)
    cursor, running = await a_dead_letter_then_a_running_last_attempt(q)
    await q.purge(dead=True, seqs=[0])  # an earlier letter taken out: the rest keep their ordinals
    await q.compact()
    crash(q)
    q = open_queue(tmp_path, max_retries=0)
    end, seqs = await fetch_dead_seqs(q, cursor)
    assert seqs == [running] and end > cursor
    assert await fetch_dead_seqs(q, 0) == (end, [running])
    await q.close()


async def test_a_dead_letter_taken_out_leaves_its_ordinal_used_after_a_reopen(tmp_path):
    q = open_queue(tmp_path, max_retries=0)
    await put(q, ["a", "b", "c"])
    lease, _ = await get(q, 2)
    await settle(q, lease, 2, {0: b"E\x00x\x00", 1: b"E\x00y\x00"})
    cursor, seqs = await fetch_dead_seqs(q, 0)
    assert len(seqs) == 2
    await q.purge(dead=True, seqs=seqs)
    for compact in (False, True):
        if compact:
            await q.compact()
        crash(q)
        q = open_queue(tmp_path, max_retries=0)
        assert await fetch_dead_seqs(q, cursor) == (cursor, [])
    lease, items = await get(q, 1)
    await settle(q, lease, 1, {0: b"E\x00z\x00"})
    assert await fetch_dead_seqs(q, cursor) == (cursor + 1, [items[0][0]])
    await q.close()
