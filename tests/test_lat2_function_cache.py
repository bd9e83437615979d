"""A function pickled by value is pickled once while it is made of the same objects, and
again as soon as anything its pickle holds changed (daskqueue/function_snapshot.py)."""

from __future__ import annotations

import pickle

import cloudpickle
import pytest

from daskqueue import function_pickle
from daskqueue.serialize import pickle_function


def _main_function(source: str, **globals_: object):
    """A function defined as in a notebook cell (module ``__main__``), and its globals."""
    namespace: dict = {"__name__": "__main__", **globals_}
    exec(source, namespace)
    return namespace["f"], namespace


@pytest.fixture
def dumps_calls(monkeypatch):
    """How many times cloudpickle pickled something."""
    calls = []
    real = cloudpickle.dumps

    def counting(obj, *args, **kwargs):
        calls.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(function_pickle.cloudpickle, "dumps", counting)
    return calls


@pytest.mark.timeout(30)
def test_an_unchanged_main_function_is_pickled_once(dumps_calls):
    f, _ = _main_function("import math\ndef f(x, y=2):\n    return math.floor(x) + y + LIMIT\n", LIMIT=10)
    first = pickle_function(f)
    assert pickle_function(f) is first
    assert pickle_function(f) is first
    assert len(dumps_calls) == 1
    assert cloudpickle.loads(first.data)(1.5) == 13


@pytest.mark.timeout(30)
def test_a_rebound_global_is_pickled_again(dumps_calls):
    f, namespace = _main_function("def f():\n    return LIMIT\n", LIMIT=1)
    first = pickle_function(f)
    namespace["LIMIT"] = 2
    second = pickle_function(f)
    assert second.digest != first.digest
    assert pickle.loads(second.data)() == 2
    namespace["LIMIT"] = 1
    assert pickle.loads(pickle_function(f).data)() == 1


@pytest.mark.timeout(30)
def test_a_global_defined_later_is_pickled_again():
    f, namespace = _main_function("def f():\n    return LATER\n")
    pickle_function(f)
    namespace["LATER"] = 7
    assert pickle.loads(pickle_function(f).data)() == 7


@pytest.mark.timeout(30)
def test_a_mutable_global_is_pickled_on_every_call(dumps_calls):
    f, namespace = _main_function("def f():\n    return list(ITEMS)\n", ITEMS=[1])
    assert pickle.loads(pickle_function(f).data)() == [1]
    namespace["ITEMS"].append(2)
    assert pickle.loads(pickle_function(f).data)() == [1, 2]
    assert len(dumps_calls) == 2


@pytest.mark.timeout(30)
def test_a_main_helper_function_is_pickled_on_every_call():
    f, namespace = _main_function("def helper():\n    return 1\ndef f():\n    return helper()\n")
    assert pickle.loads(pickle_function(f).data)() == 1
    namespace["helper"].__code__ = (lambda: 2).__code__  # the helper's body changed in place
    assert pickle.loads(pickle_function(f).data)() == 2


@pytest.mark.timeout(30)
def test_changed_defaults_and_closures_are_pickled_again():
    f, _ = _main_function("def f(x=1):\n    return x\n")
    pickle_function(f)
    f.__defaults__ = (5,)
    assert pickle.loads(pickle_function(f).data)() == 5
    f.__kwdefaults__ = None

    def outer(value):
        def g():
            return value
        return g

    g = outer(3)
    assert pickle.loads(pickle_function(g).data)() == 3
    g.__closure__[0].cell_contents = 4
    assert pickle.loads(pickle_function(g).data)() == 4
    g.__closure__[0].cell_contents = [1]  # a mutable closure value: never cached
    pickle_function(g)
    g.__closure__[0].cell_contents.append(2)
    assert pickle.loads(pickle_function(g).data)() == [1, 2]


@pytest.mark.timeout(30)
def test_an_attribute_set_on_the_function_is_pickled_again():
    f, _ = _main_function("def f():\n    return 1\n")
    pickle_function(f)
    f.tag = "x"
    assert pickle.loads(pickle_function(f).data).tag == "x"


@pytest.mark.timeout(30)
def test_a_large_by_value_pickle_is_not_kept(dumps_calls):
    f, _ = _main_function("def f():\n    return len(BIG)\n", BIG=b"x" * (function_pickle.BY_VALUE_CACHE_MAX_BYTES + 1))
    pickle_function(f)
    pickle_function(f)
    assert len(dumps_calls) == 2
