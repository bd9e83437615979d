"""Pickling functions once, by reference or by value, and packing payloads."""

from __future__ import annotations

import pickle

import cloudpickle
import pytest

from daskqueue.errors import InvalidTaskError, PayloadTooLargeError, SerializationError
from daskqueue.serialize import (ResultRecord, Segment, TaggedResultRecord, decode_delivery, encode_delivery,
                                 pack_payloads, pickle_function)
from tests import tasks


def test_module_function_is_pickled_by_reference_and_cached():
    first = pickle_function(tasks.double)
    assert pickle.loads(first.data) is tasks.double
    assert pickle_function(tasks.double) is first  # pickled once per process
    assert len(first.digest) == 16


def test_main_module_function_is_pickled_by_value():
    def f(x):
        return x + 1

    f.__module__ = "__main__"
    f.__qualname__ = "f"
    pickled = pickle_function(f)
    assert pickled.data != pickle.dumps(tasks.double)
    assert cloudpickle.loads(pickled.data)(1) == 2


def test_lambda_is_pickled_by_value_and_same_code_gives_same_digest():
    a = pickle_function(lambda x: x * 3)
    assert pickle.loads(a.data)(2) == 6


def test_non_callable_and_unpicklable_functions_get_typed_errors():
    with pytest.raises(InvalidTaskError, match="task 4"):
        pickle_function(42, index=4)
    with pytest.raises(SerializationError):
        pickle_function(tasks.Unpicklable().__reduce__)


def test_pack_payloads_offsets_delimit_each_pickle():
    from array import array

    offsets, data = pack_payloads([(1,), ("two",), None], max_message_bytes=1000)
    offs = array("I")
    offs.frombytes(offsets)
    assert [pickle.loads(data[a:b]) for a, b in zip(offs, offs[1:])] == [(1,), ("two",), None]


def test_pack_payloads_names_the_bad_index_and_the_too_large_one():
    with pytest.raises(SerializationError) as info:
        pack_payloads([1, tasks.Unpicklable(), 3], max_message_bytes=1000, first_index=10)
    assert info.value.index == 11
    with pytest.raises(PayloadTooLargeError) as info:
        pack_payloads([b"", b"x" * 2000], max_message_bytes=1000)
    assert info.value.index == 1


def test_a_delivery_decodes_to_the_segments_the_queue_built():
    offsets, data = pack_payloads([b"a", b"bc"], max_message_bytes=100)
    segment = Segment(7, 2, 1, 0, None, "t", 3, "k", offsets, data)
    lease_id, queue_index, segments = decode_delivery(encode_delivery(5, 2, [segment]))
    assert (lease_id, queue_index, segments) == (5, 2, [segment])
    assert type(segments[0]) is Segment
    assert [pickle.loads(p) for p in segments[0].payloads()] == [b"a", b"bc"]


def test_a_result_record_is_stored_as_a_plain_tuple_and_read_back_as_a_record():
    record = ResultRecord(1, [(10, 2)], [1], pickle.dumps(["x", None]), {1: b"err"})
    stored = record.to_bytes()
    assert type(pickle.loads(stored)) is tuple  # the RESULT log record stores no class path
    assert ResultRecord.from_bytes(stored) == record
    assert type(ResultRecord.from_bytes(stored)) is ResultRecord


def test_result_records_of_older_stores_and_of_a_longer_future_layout_are_read():
    fields = (1, [(10, 2)], [], pickle.dumps(["x", "y"]), None)
    assert ResultRecord.from_bytes(pickle.dumps(fields)) == ResultRecord(*fields)
    assert ResultRecord.from_bytes(pickle.dumps(ResultRecord(*fields))) == ResultRecord(*fields)
    # The 7th field is the producer tag (0, the owner's, reads as the old layout).
    assert ResultRecord.from_bytes(pickle.dumps(fields + (3, 0, "a field added later"))) == ResultRecord(*fields, 3)
    tagged = ResultRecord.from_bytes(pickle.dumps(fields + (3, 77, "a field added later")))
    assert tagged == TaggedResultRecord(*fields, 3, 77) and tagged.producer == 77


def test_the_client_keeps_the_newest_functions_pickled_by_reference_and_no_more():
    import functools

    from daskqueue import defaults, function_pickle

    partials = [functools.partial(tasks.double, i) for i in range(10_000)]  # pickled by reference
    for p in partials:
        pickle_function(p)
    assert len(function_pickle._by_reference_cache) == defaults.FUNCTION_CACHE_ENTRIES
    assert pickle_function(partials[-1]) is pickle_function(partials[-1])  # the newest are cached
    assert pickle_function(tasks.double) is pickle_function(tasks.double)


def test_ten_thousand_distinct_lambdas_leave_the_clients_function_tables_bounded():
    from daskqueue import defaults, function_pickle
    from daskqueue.queue.encode import PutOptions, encode_calls
    from daskqueue.serialize import SentFunctions

    sent = SentFunctions()  # what a pool remembers having sent one queue
    shipped = 0
    for i in range(10_000):  # a service submitting one new closure per request
        (batch,) = encode_calls([(lambda i=i: i, (), None)], PutOptions(), size=1, limit=2**20)
        shipped += len(sent.unsent(batch.funcs))
        sent.update(batch.funcs)
    assert shipped == 10_000
    assert len(sent) == defaults.SENT_FUNCTIONS_PER_QUEUE
    assert len(function_pickle._by_reference_cache) <= defaults.FUNCTION_CACHE_ENTRIES
    # A digest forgotten here is sent again (harmless: the queue keeps its copy); the newest is not.
    assert sent.unsent(batch.funcs) == {} and list(sent.unsent({b"old" * 4: b"f"})) == [b"old" * 4]
    sent.discard(next(iter(batch.funcs)))  # the queue said it dropped it: sent again next time
    assert sent.unsent(batch.funcs) == batch.funcs


def test_the_lru_evicts_the_entry_used_longest_ago():
    from daskqueue.lru import LRU

    lru = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the newest
    lru.put("c", 3)
    assert "b" not in lru and lru.get("a") == 1 and lru.get("c") == 3 and len(lru) == 2
    assert lru.pop("a") == 1 and lru.pop("a") is None
    with pytest.raises(ValueError):
        LRU(0)


MAIN_SCRIPT = """
import functools, sys
from daskqueue.serialize import pickle_function

def add(x, y):
    return x + y

class Doubler:
    def __call__(self, x):
        return 2 * x

for func in (functools.partial(add, 2), functools.partial(functools.partial(add, y=5)),
             functools.partial(map, add, [1])):
    data = pickle_function(func).data
    sys.stdout.buffer.write(len(data).to_bytes(4, "big") + data)
"""


@pytest.mark.timeout(60)
def test_a_partial_of_a_main_function_is_pickled_by_value_so_other_processes_load_it(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(MAIN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, check=True, env=env).stdout
    funcs = []
    while out:
        n = int.from_bytes(out[:4], "big")
        funcs.append(pickle.loads(out[4 : 4 + n]))  # here, __main__ has no add: only by value loads
        out = out[4 + n :]
    first, nested, mapped = funcs
    assert first(3) == 5 and nested(1) == 6 and list(mapped([10])) == [11]


def test_a_partial_of_an_importable_function_stays_by_reference():
    import functools

    pickled = pickle_function(functools.partial(tasks.add, 1))
    assert b"cloudpickle" not in pickled.data and pickle.loads(pickled.data)(2) == 3


class _Scale:  # a callable instance: its pickle holds its state, not just a name
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return self.k * x


def test_a_callable_holding_mutable_state_is_pickled_again_on_each_call():
    """A partial holding a list, a callable instance, a bound method: their pickles carry
    the state they hold at that moment, so the client must not reuse an older one."""
    import functools

    seen = []
    growing = functools.partial(tasks.double, seen)
    first = pickle_function(growing)
    seen.append(1)
    assert pickle.loads(pickle_function(growing).data).args == ([1],)
    assert pickle_function(growing).digest != first.digest

    scale = _Scale(2)
    assert pickle.loads(pickle_function(scale).data)(3) == 6
    scale.k = 5
    assert pickle.loads(pickle_function(scale).data)(3) == 15
    bound = scale.__call__
    pickle_function(bound)
    scale.k = 7
    assert pickle.loads(pickle_function(bound).data)(3) == 21

    fixed = functools.partial(tasks.double, 4)  # immutable arguments: kept
    assert pickle_function(fixed) is pickle_function(fixed)
