"""One fence state, by source queue: ``Fences`` and the core's by-source API beside the
per-key ``fence`` / ``unfence`` that the actor calls today."""

from __future__ import annotations

import pickle

from daskqueue.queue.fences import ANY_SOURCE, Fences
from tests.queue.test_core import make_core, seqs
from tests.queue.test_keys import put


def test_a_key_stays_fenced_until_every_source_that_fenced_it_releases_it():
    fences = Fences()
    fences.add(3, ["a", "b"])
    fences.add(5, ["b"])
    fences.release(3, ["a", "b"])
    assert "a" not in fences and "b" in fences
    assert fences.by_source() == {5: {"b"}} and fences.held_by(3) == set()
    fences.release(5, ["b"])
    assert not fences and fences.keys() == set()


def test_release_everywhere_unfences_a_key_of_every_source():
    fences = Fences()
    fences.add(1, ["a", "b"])
    fences.add(2, ["a"])
    fences.release_everywhere(["a"])
    assert fences.by_source() == {1: {"b"}}


def test_a_snapshot_loads_back_the_same_fences():
    fences = Fences()
    fences.add(1, ["b", "a"])
    fences.add(ANY_SOURCE, ["c"])
    again = Fences()
    again.load(pickle.loads(pickle.dumps(fences.snapshot())))
    assert again.by_source() == {1: {"a", "b"}, ANY_SOURCE: {"c"}}


def test_a_key_fenced_by_source_waits_until_that_source_releases_it():
    core = make_core()
    core.fence_from(4, ["b"])
    b = put(core, 1, "b")
    assert core.get_batch(10, now=0) is None
    assert core.fences.by_source() == {4: {"b"}} and core.fenced == {"b"}
    core.unfence_from(4, ["b"])
    assert seqs(core.get_batch(10, now=0)) == b


def test_the_per_key_api_and_the_by_source_api_share_one_state():
    core = make_core()
    core.fence_from(4, ["b"])
    core.fence(["c"])
    assert core.fenced == {"b", "c"}
    core.unfence(["b"])  # the source-less spelling (tests, older exports): any source
    assert core.fences.by_source() == {ANY_SOURCE: {"c"}}


def test_fences_by_source_go_with_a_hand_off():
    old = make_core()
    old.fence_from(2, ["b"])
    put(old, 1, "b")
    new = make_core()
    new.import_state(pickle.loads(pickle.dumps(old.export_state(now=0))), now=0)
    assert new.get_batch(10, now=0) is None and new.fences.by_source() == {2: {"b"}}
    new.validate()


def test_an_export_of_the_older_form_fences_its_keys_for_any_source():
    old = make_core()
    put(old, 1, "b")
    state = old.export_state(now=0)
    del state["fences"]
    state["fenced"] = ["b"]
    new = make_core()
    new.import_state(state, now=0)
    assert new.fences.by_source() == {ANY_SOURCE: {"b"}}
