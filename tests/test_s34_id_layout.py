"""Task ids: ``queue_base(q) + seq``, consecutive per queue, spread over a hash table's slots,
below 2**63; a durable ``daskqueue map`` job's ids of the layout before are converted on resume."""

import json
import random
from array import array

import pytest

from daskqueue.mapfiles import IDS_FILE, NO_ID, State
from daskqueue.messages import MAX_QUEUES, MAX_SEQ, id_range, make_id, queue_base, split_id

pytestmark = pytest.mark.timeout(30)


def test_ids_round_trip_and_queues_never_meet():
    rng = random.Random(34)
    for q, seq in [(0, 0), (0, MAX_SEQ - 1), (MAX_QUEUES - 1, 0), (MAX_QUEUES - 1, MAX_SEQ - 1)] + [
            (rng.randrange(MAX_QUEUES), rng.randrange(MAX_SEQ)) for _ in range(10_000)]:
        assert split_id(make_id(q, seq)) == (q, seq)
    for q in list(range(300)) + list(range(MAX_QUEUES - 300, MAX_QUEUES - 1)):
        assert queue_base(q) + MAX_SEQ <= queue_base(q + 1)
    assert 0 < make_id(0, 0) and make_id(MAX_QUEUES - 1, MAX_SEQ - 1) < 2**63
    assert make_id(0, 5) != 5  # an id is never its seq, queue 0 included


def test_consecutive_seqs_are_a_range_of_consecutive_ids():
    r = id_range(3, 100, 50)
    assert r.step == 1 and list(r) == [make_id(3, s) for s in range(100, 150)]


@pytest.mark.parametrize("n_queues", [1, 2, 7, 64])
def test_the_ids_of_a_big_batch_spread_over_a_dicts_first_slots(n_queues):
    # A dict of 2**20 keys has 2**21 slots; a key's first probe is its low 21 bits. With ids
    # seq << 16 | queue, a million ids of a batch had at most 32 * n_queues distinct ones.
    per_queue = 2**20 // n_queues
    ids = [i for q in range(n_queues) for i in id_range(q, 1000, per_queue)]
    first_slots = {i & (2**21 - 1) for i in ids}
    assert len(first_slots) > 0.4 * len(ids)  # random keys: 0.79; the ids: 0.54-1.0


def test_a_durable_map_jobs_old_ids_are_converted_on_resume(tmp_path):
    job = dict(format=1, func="m:f", input="in.txt", json=False, items=4, submitted=3)
    (tmp_path / "state.json").write_text(json.dumps(job))
    old = array("Q", [(7 << 16) | 0, NO_ID, (9 << 16) | 1])  # seq << 16 | queue, as 0.3.0 wrote them
    (tmp_path / "ids.bin").write_bytes(old.tobytes())
    state = State(tmp_path, "m:f", "in.txt", False, 4)
    assert list(state.ids) == [make_id(0, 7), NO_ID, make_id(1, 9)]
    assert state.index_of(make_id(1, 9)) == 2 and state.index_of((9 << 16) | 1) is None
    assert not (tmp_path / "ids.bin").exists() and (tmp_path / IDS_FILE).exists()
    again = State(tmp_path, "m:f", "in.txt", False, 4)  # converted once: read as it is now
    assert list(again.ids) == list(state.ids)
