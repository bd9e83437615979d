"""Encoding submissions into put batches (daskqueue/queue/encode.py): pure, no cluster."""

from __future__ import annotations

import pickle
from array import array

import pytest

from daskqueue.errors import InvalidTaskError, PayloadTooLargeError, SerializationError
from daskqueue.messages import Kind
from daskqueue.queue.encode import (
    PutOptions,
    calls_from_tasks,
    chunk_size,
    encode_calls,
    encode_chunks,
    encode_payloads,
    encode_uniform,
)
from daskqueue.serialize import pickle_function
from tests import tasks

LIMIT = 2**20


def unpack(group):
    offsets = array("I")
    offsets.frombytes(group.offsets)
    return [pickle.loads(group.data[a:b]) for a, b in zip(offsets, offsets[1:])]


@pytest.mark.parametrize(
    "n, n_queues, put_batch_size, expected",
    [(0, 2, 10, 1), (1, 4, 10, 1), (10, 2, 100, 5), (11, 2, 100, 6), (1000, 2, 100, 100)],
)
def test_chunk_size_spreads_a_call_over_the_queues_within_the_batch_limit(n, n_queues, put_batch_size, expected):
    assert chunk_size(n, n_queues=n_queues, put_batch_size=put_batch_size) == expected


def test_the_chunk_loop_covers_every_position_once_in_order():
    seen = encode_chunks(10, 4, lambda positions: positions)
    assert seen == [range(0, 4), range(4, 8), range(8, 10)]
    assert encode_chunks(0, 4, lambda positions: positions) == []


def test_one_function_tasks_take_the_uniform_path_one_group_per_chunk():
    options = PutOptions(type="t", priority=3, key="k", delay_s=0.5)
    batches = encode_uniform([(tasks.add, i, 1) for i in range(5)], options, size=2, limit=LIMIT)
    assert [b.positions for b in batches] == [[range(0, 2)], [range(2, 4)], [range(4, 5)]]
    digest = pickle_function(tasks.add).digest
    for batch in batches:
        (group,) = batch.groups
        assert (group.kind, group.digest, group.type, group.priority, group.key, group.delay_s) == (
            Kind.CALL, digest, "t", 3, "k", 0.5)
        assert list(batch.funcs) == [digest]
    assert [args for b in batches for args in unpack(b.groups[0])] == [(i, 1) for i in range(5)]


@pytest.mark.parametrize("batch", [[(tasks.add, 1), (tasks.double, 2)], [(tasks.add, 1), "xy"], [], [42]])
def test_anything_but_one_function_tasks_leaves_the_uniform_path(batch):
    assert encode_uniform(batch, PutOptions(), size=10, limit=LIMIT) is None


def test_mixed_calls_group_by_kind_and_function_and_keep_input_positions():
    calls = [(tasks.add, (1,), None), (tasks.double, (2,), None), (tasks.add, (3,), {"y": 4})]
    (batch,) = encode_calls(calls, PutOptions(), size=10, limit=LIMIT)
    kinds = [(g.kind, g.digest) for g in batch.groups]
    assert kinds == [
        (Kind.CALL, pickle_function(tasks.add).digest),
        (Kind.CALL, pickle_function(tasks.double).digest),
        (Kind.CALL_KW, pickle_function(tasks.add).digest),
    ]
    assert batch.positions == [[0], [1], [2]]
    assert [unpack(g) for g in batch.groups] == [[(1,)], [(2,)], [((3,), {"y": 4})]]


def test_raw_items_are_pickled_each_on_its_own_with_no_function():
    batches = encode_payloads(["a", "b", "c"], None, kind=Kind.RAW, function=None, options=PutOptions(),
                              size=2, limit=LIMIT, what="item")
    assert [b.funcs for b in batches] == [{}, {}]
    assert [unpack(b.groups[0]) for b in batches] == [["a", "b"], ["c"]]
    assert all(b.groups[0].digest is None for b in batches)


def test_an_unpicklable_argument_is_named_by_its_input_position():
    calls = [(tasks.add, (i,), None) for i in range(6)] + [(tasks.double, (tasks.Unpicklable(),), None)]
    with pytest.raises(SerializationError, match="arguments of task 6") as info:
        encode_calls(calls, PutOptions(), size=4, limit=LIMIT)
    assert info.value.index == 6
    with pytest.raises(SerializationError, match="item of task 3") as info:
        encode_payloads([1, 2, 3, tasks.Unpicklable()], None, kind=Kind.RAW, function=None,
                        options=PutOptions(), size=2, limit=LIMIT, what="item")
    assert info.value.index == 3


def test_a_single_call_that_cannot_be_pickled_names_no_position():
    with pytest.raises(SerializationError) as info:
        encode_calls([(tasks.double, (tasks.Unpicklable(),), None)], PutOptions(), size=1, limit=LIMIT)
    assert info.value.index is None


def test_an_oversized_payload_is_named_by_its_input_position():
    batch = [(tasks.double, b"x")] * 3 + [(tasks.double, b"x" * 200)]
    with pytest.raises(PayloadTooLargeError) as info:
        encode_uniform(batch, PutOptions(), size=2, limit=100)
    assert info.value.index == 3 and info.value.limit == 100


def test_tasks_that_are_not_tuples_are_invalid_naming_the_first():
    assert calls_from_tasks([(tasks.add, 1, 2)]) == [(tasks.add, (1, 2), None)]
    with pytest.raises(InvalidTaskError, match="task 1"):
        calls_from_tasks([(tasks.add, 1), (), 7])


def test_a_keys_messages_keep_put_order_when_their_functions_alternate():
    from daskqueue.queue.encode import PutOptions, encode_keyed

    calls = [(len, ("a",)), (str, (1,)), (len, ("bb",))]
    batches = encode_keyed(["d", "d", "d"], lambda k: 0, lambda i: (Kind.CALL, calls[i][0], calls[i][1]),
                           PutOptions(), size=100, limit=1 << 20, what="arguments")
    (queue, batch), = batches
    assert queue == 0
    assert [list(p) for p in batch.positions] == [[0], [1], [2]]  # three runs, in put order


@pytest.mark.parametrize("field", ["type", "key"])
def test_a_type_or_key_longer_than_a_queue_stores_is_refused_naming_the_limit_and_length(field):
    from daskqueue.errors import ConfigurationError, FieldTooLongError
    from daskqueue.validate import MAX_LABEL_BYTES

    PutOptions(**{field: "x" * MAX_LABEL_BYTES})  # the longest that fits
    with pytest.raises(FieldTooLongError, match=f"{field} is 65,536 bytes.*at most 65,535") as caught:
        PutOptions(**{field: "é" * 2**15})  # 32,768 characters, 65,536 bytes
    assert (caught.value.field, caught.value.length, caught.value.limit) == (field, 2**16, MAX_LABEL_BYTES)
    assert isinstance(caught.value, ConfigurationError)
    with pytest.raises(ConfigurationError, match="UTF-8"):
        PutOptions(**{field: "\udcff"})


def test_keyed_groups_keep_the_submissions_time_limit_and_delay():
    from daskqueue.queue.encode import encode_keyed

    options = PutOptions(type=None, priority=3, delay_s=2.0, time_limit_s=7.0)
    ((_, batch),) = encode_keyed(["a"], lambda key: 0, lambda i: (Kind.RAW, None, i), options,
                                 size=10, limit=LIMIT, what="item")
    (group,) = batch.groups
    assert (group.key, group.priority, group.delay_s, group.time_limit_s) == ("a", 3, 2.0, 7.0)
