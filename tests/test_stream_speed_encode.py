"""batch_submit's encoding: tasks ``(func, x)`` are packed as bare arguments (as ``map``'s),
every other shape of task as its argument tuple (or list), as before."""

import pytest

from daskqueue.packed import unpack
from daskqueue.queue.encode import PutOptions, encode_uniform
from tests.tasks import add, double

pytestmark = pytest.mark.timeout(30)


def _payloads(batches):
    """Every message's payload of the encoded (packed) batches, in order, and whether each
    group was packed as one-argument calls."""
    out, shapes = [], []
    for batch in batches:
        for group in batch.groups:
            assert group.packed
            items, one = unpack(group.data)
            out += [(x,) for x in items] if one else items
            shapes.append(one)
    return out, shapes


def _encode(tasks):
    return encode_uniform(tasks, PutOptions(), size=400, limit=2**20, pack_max_bytes=256 * 2**10)


def test_one_argument_tuples_are_packed_as_bare_arguments():
    payloads, shapes = _payloads(_encode([(double, i) for i in range(1000)]))
    assert payloads == [(i,) for i in range(1000)] and shapes and all(shapes)


@pytest.mark.parametrize("tasks", [
    [(add, i, 1) for i in range(100)],  # two arguments
    [[double, i] for i in range(100)],  # lists: their payloads stay lists
    [(double, i) for i in range(99)] + [(double,)],  # one task without an argument
])
def test_other_tasks_keep_their_argument_tuples(tasks):
    payloads, shapes = _payloads(_encode(tasks))
    assert payloads == [t[1:] for t in tasks] and not any(shapes)
