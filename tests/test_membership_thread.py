"""The membership thread (daskqueue/membership.py, daskqueue/reactions.py): every wait bounded,
one pool's slow reaction holding no other, and ``forget`` releasing the thread and the client.
A stub client stands in for Dask where the test needs a scheduler that does not answer."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from distributed import Client

from daskqueue import ConsumerPool, QueuePool, defaults, membership
from tests.helpers import wait_until


class StubClient:
    """What a Membership uses of a Client; ``identity`` answers with ``workers`` unless
    ``hang`` is set, then it waits like a scheduler that does not answer."""

    def __init__(self, workers):
        self.id = f"stub-{id(self)}"
        self.status = "running"
        self.workers = set(workers)
        self.hang = threading.Event()
        self.unhang = threading.Event()
        self.scheduler = self

    def register_plugin(self, plugin):
        pass

    def subscribe_topic(self, topic, handler):
        self.handler = handler

    def unsubscribe_topic(self, topic):
        pass

    def identity(self, n_workers=-1):
        return {"workers": {w: {} for w in self.workers}}

    def sync(self, func, *args, callback_timeout=None, **kwargs):
        if self.hang.is_set():
            if self.unhang.wait(callback_timeout):  # None: forever, as Dask's own call waits
                raise RuntimeError("the scheduler answered after the test ended")
            raise TimeoutError(f"no answer in {callback_timeout} s")
        return func(*args, **kwargs)

    def scheduler_info(self, n_workers=-1):  # what the membership thread called before
        return self.sync(self.identity, n_workers=n_workers)

    def join(self, worker):
        self.workers.add(worker)
        self.handler((0.0, {"action": "join", "worker": worker}))


class Recorder:
    def __init__(self, block=None):
        self.calls = []
        self.block = block

    def on_membership(self, joined, left, retiring):
        self.calls.append(sorted(joined))
        if self.block is not None:
            self.block.wait(60)


@pytest.fixture
def stub():
    made = []

    def make(workers=("a",)):
        client = StubClient(workers)
        m = membership.Membership(client)
        made.append((client, m))
        return client, m

    yield make
    for client, m in made:
        client.unhang.set()
        m.close()


def test_a_pool_whose_reaction_hangs_holds_neither_the_thread_nor_the_other_pools(stub, monkeypatch):
    monkeypatch.setattr(defaults, "REACTION_WAIT_S", 0.2)
    client, m = stub()
    stuck, fine = Recorder(block=threading.Event()), Recorder()
    m.add_listener(stuck)
    m.add_listener(fine)
    try:
        client.join("b")
        wait_until(lambda: fine.calls == [["b"]], timeout_s=10)
        client.join("c")  # the stuck pool's reaction to "b" still runs: "c" waits for it, others not
        wait_until(lambda: fine.calls == [["b"], ["c"]], timeout_s=10)
        client.join("d")
        wait_until(lambda: fine.calls == [["b"], ["c"], ["d"]], timeout_s=10)
        assert stuck.calls == [["b"]]
    finally:
        stuck.block.set()
    # Once free, it gets what it missed as one change, as one look at the cluster would say.
    wait_until(lambda: stuck.calls == [["b"], ["c", "d"]], timeout_s=10)


def test_changes_a_slow_pool_missed_are_merged_as_one_look_at_the_cluster_would_say():
    from daskqueue.reactions import merge

    assert merge([({"a"}, set(), set()), (set(), {"a"}, set())]) == (set(), {"a"}, set())  # came, went
    assert merge([(set(), {"a"}, set()), ({"a"}, set(), set())]) == ({"a"}, {"a"}, set())  # went, came back
    assert merge([(set(), set(), {"a", "b"}), (set(), {"a"}, set())]) == (set(), {"a"}, {"b"})


def test_a_late_reaction_sees_the_cluster_as_it_was_at_its_change(stub, monkeypatch):
    monkeypatch.setattr(defaults, "REACTION_WAIT_S", 0.2)
    client, m = stub()

    class Viewer(Recorder):
        def on_membership(self, joined, left, retiring):
            if self.block is not None:  # held past the next change: it looks at the cluster late
                self.block.wait(60)
            self.calls.append((sorted(joined), sorted(retiring), sorted(m.workers), sorted(m.retiring)))

    late, fine = Viewer(block=threading.Event()), Viewer()
    m.add_listener(late)
    m.add_listener(fine)
    try:
        client.join("b")
        wait_until(lambda: len(fine.calls) == 1, timeout_s=10)
        client.handler((0.0, {"action": "retiring", "workers": ["b"]}))
        wait_until(lambda: len(fine.calls) == 2, timeout_s=10)
    finally:
        late.block.set()
    wait_until(lambda: len(late.calls) == 2, timeout_s=10)
    assert late.calls == fine.calls == [(["b"], [], ["a", "b"], []), ([], ["b"], ["a", "b"], ["b"])]
    assert m.retiring == {"b"} and m.placeable() == ["a"]  # other threads see the newest


def test_a_reaction_that_raises_is_logged_and_the_others_still_react(stub, caplog):
    client, m = stub()

    class Broken:
        def on_membership(self, joined, left, retiring):
            raise RuntimeError("boom")

    broken, fine = Broken(), Recorder()
    m.add_listener(broken)
    m.add_listener(fine)
    client.join("b")
    client.join("c")
    wait_until(lambda: sum(fine.calls, []) == ["b", "c"], timeout_s=10)
    assert "failed to follow the cluster" in caplog.text and "boom" in caplog.text


def test_a_scheduler_that_does_not_answer_is_given_up_on_and_asked_again(stub, monkeypatch):
    monkeypatch.setattr(defaults, "MEMBERSHIP_CALL_TIMEOUT_S", 0.2)
    monkeypatch.setattr(membership, "RETRY_S", 0.05)
    client, m = stub()
    fine = Recorder()
    m.add_listener(fine)
    client.hang.set()
    client.join("b")
    wait_until(lambda: not m._events.qsize(), timeout_s=10)  # the thread took the event and asks
    client.hang.clear()  # the scheduler answers again: the next look sees "b"
    wait_until(lambda: fine.calls == [["b"]], timeout_s=10)


def test_a_membership_whose_client_closed_ends_its_thread(stub, monkeypatch):
    monkeypatch.setattr(defaults, "MEMBERSHIP_IDLE_S", 0.05)
    client, m = stub()
    membership._by_client[client.id] = m
    client.status = "closed"
    wait_until(lambda: not m._thread.is_alive(), timeout_s=10)
    assert client.id not in membership._by_client


def _threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("daskqueue-"))


def test_forgetting_closed_pools_returns_the_threads_and_clients_they_held(cluster, client):
    gc.collect()
    threads_before, held_before = _threads(), set(membership._by_client)
    clients = []
    for i in range(4):  # pools on clients of their own, each closed by the user after its pools
        own = Client(cluster)
        qp = QueuePool(own, 1)
        cp = ConsumerPool(own, qp)
        cp.close()
        qp.close()
        membership.forget(cp)
        membership.forget(qp)
        membership.forget(qp)  # idempotent
        assert own.id not in membership._by_client
        own.close()
        clients.append(weakref.ref(own))
        del own, qp, cp
    for i in range(6):  # pools on one shared client
        pools = [QueuePool(client, 1) for _ in range(2)]
        for qp in pools:
            qp.close()
            membership.forget(qp)
        del pools, qp
    gc.collect()
    wait_until(lambda: _threads() == threads_before, timeout_s=30)
    assert set(membership._by_client) <= held_before
    # Nothing of daskqueue's keeps a closed client alive (Dask keeps its newest as the default).
    assert sum(ref() is not None for ref in clients) <= 1


def test_a_membership_ends_when_the_last_pool_holding_it_is_forgotten():
    class Pool:
        def __init__(self, client):
            self.client = client

        def on_membership(self, joined, left, retiring):
            pass

    client = StubClient(["a"])
    starting, listening = Pool(client), Pool(client)
    m = membership.membership(client, owner=starting)  # holds it before it listens
    assert membership.membership(client) is m
    m.add_listener(listening)
    membership.forget(listening)
    assert m._thread.is_alive() and membership.membership(client) is m  # `starting` still holds it
    membership.forget(starting)
    assert not m._thread.is_alive() and client.id not in membership._by_client
    membership.forget(starting)  # idempotent
