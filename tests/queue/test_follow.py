"""The queue pool's membership reactions, with fake actors (no cluster): two-phase hand-off
(``handoff_done`` once the successor is in, ``handoff_abort`` when none could be), and no
reaction holds the membership thread past ``SUCCESSOR_WAIT_S``."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from daskqueue import defaults
from daskqueue.queue.follow import Follower
from daskqueue.queue.table import QueueTable


def answered(value=None):
    f = Future()
    f.set_result(value)
    return f


#: How much longer than ``SUCCESSOR_WAIT_S`` (patched to a fraction of a second) a reaction
#: may hold the thread on a loaded machine. A reaction that waited for anything else waits
#: ``CONTROL_CALL_TIMEOUT_S`` (10 s), the default ``SUCCESSOR_WAIT_S`` (20 s) or forever.
SLACK_S = 3.0


class FakeQueue:
    """A queue actor's handle: records the calls; ``hand_off`` answers with a state."""

    _cls = object

    def __init__(self, address, *, two_phase=True, answers=None):
        self._address = address
        self.key = f"queue-{address}"
        self.calls = []
        self.answers = {"hand_off": b"state", **(answers or {})}
        if not two_phase:  # an actor from before two-phase hand-off: no such methods
            self.handoff_done = self.handoff_abort = None

    def __getattr__(self, method):
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args):
            self.calls.append(method)
            return answered(self.answers.get(method))

        return call

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        if value is None and name.startswith("handoff_"):
            raise AttributeError(name)
        return value


class FakeActorFuture:
    """What ``client.submit(..., actor=True)`` returns: done when the test says so."""

    def __init__(self, handle=None, error=None):
        self.handle, self.error, self.released = handle, error, False
        self._done = threading.Event()
        if handle is not None or error is not None:
            self._done.set()

    def finish(self, handle):
        self.handle = handle
        self._done.set()

    def done(self):
        return self._done.is_set()

    def result(self, timeout=None):
        if not self._done.wait(timeout):
            raise TimeoutError(f"timed out after {timeout} s.")
        if self.error is not None:
            raise self.error
        return self.handle

    def release(self):
        self.released = True


class FakeClient:
    def __init__(self, futures):
        self.futures = list(futures)  # what each submit returns, in turn
        self.submitted = 0

    def submit(self, *args, **kwargs):
        self.submitted += 1
        return self.futures.pop(0)

    def scatter(self, data, **kwargs):
        return FakeActorFuture(handle=data)

    def sync(self, *args, **kwargs):
        raise RuntimeError("no scheduler here")  # the registry logs it and goes on


class FakeMembership:
    def __init__(self, workers):
        self.workers = workers
        self.retiring = set()

    def placeable(self):
        return list(self.workers)


class FakePool:
    name, durability, dirpath, closed = "fake", "durable", None, False

    def __init__(self, handles, futures, workers):
        self.client = FakeClient(futures)
        self.membership = FakeMembership(workers)
        self.table = QueueTable("durable", handles, [FakeActorFuture(h) for h in handles],
                                scheduler_lost=lambda: None, settled=lambda q: 0)
        self.n_queues = len(handles)

    def actor_spec(self, q):
        return object, (q,), {}

    def consumer_pools(self):
        return []

    def serving(self):
        return dict(self.table.in_service())


def test_a_hand_off_is_made_final_only_once_the_successor_is_installed():
    old, new = FakeQueue("w0"), FakeQueue("w1")
    pool = FakePool([old], [FakeActorFuture(new)], ["w0", "w1"])
    Follower(pool).on_membership(set(), set(), {"w0"})
    assert pool.table.handles[0] is new and not pool.table.moving
    assert old.calls[:2] == ["hand_off", "handoff_done"] and "handoff_abort" not in old.calls


def test_a_successor_that_cannot_start_lets_the_old_queue_serve_on():
    old = FakeQueue("w0")
    failing = [FakeActorFuture(error=RuntimeError("no room")), FakeActorFuture(error=RuntimeError("no room"))]
    pool = FakePool([old], failing, ["w0", "w1"])
    Follower(pool).on_membership(set(), set(), {"w0"})
    assert pool.table.handles[0] is old and not pool.table.moving and not pool.table.lost
    assert "handoff_abort" in old.calls and "handoff_done" not in old.calls


def test_a_failed_hand_off_is_tried_again_on_the_next_event_while_its_worker_retires():
    old, new = FakeQueue("w0"), FakeQueue("w1")
    pool = FakePool([old], [FakeActorFuture(error=RuntimeError("no room"))] * 2 + [FakeActorFuture(new)],
                    ["w0", "w1"])
    pool.membership.retiring = {"w0"}
    follower = Follower(pool)
    follower.on_membership(set(), set(), {"w0"})
    assert pool.table.handles[0] is old
    follower.on_membership({"w2"}, set(), set())  # another event: w0 still retires
    assert pool.table.handles[0] is new and old.calls.count("hand_off") == 2


def test_a_successor_slower_than_the_wait_is_aborted_within_the_bound(monkeypatch):
    monkeypatch.setattr(defaults, "SUCCESSOR_WAIT_S", 0.3)
    old, slow = FakeQueue("w0"), FakeActorFuture()
    pool = FakePool([old], [slow, FakeActorFuture()], ["w0", "w1"])
    started = time.monotonic()
    Follower(pool).on_membership(set(), set(), {"w0"})
    assert time.monotonic() - started < 0.3 + SLACK_S < defaults.CONTROL_CALL_TIMEOUT_S
    assert "handoff_abort" in old.calls and pool.table.handles[0] is old and slow.released


def test_a_successor_is_dropped_when_the_old_queue_already_serves_again():
    old, new = FakeQueue("w0", answers={"handoff_done": False}), FakeQueue("w1")  # too late
    pool = FakePool([old], [FakeActorFuture(new)], ["w0", "w1"])
    Follower(pool).on_membership(set(), set(), {"w0"})
    assert pool.table.handles[0] is old and not pool.table.moving and "close" in new.calls


def test_an_actor_without_two_phase_hand_off_is_moved_as_before():
    old, new = FakeQueue("w0", two_phase=False), FakeQueue("w1")
    pool = FakePool([old], [FakeActorFuture(new)], ["w0", "w1"])
    Follower(pool).on_membership(set(), set(), {"w0"})
    assert pool.table.handles[0] is new


def test_a_slow_reopen_does_not_hold_the_membership_thread_and_is_installed_later(monkeypatch):
    monkeypatch.setattr(defaults, "SUCCESSOR_WAIT_S", 0.3)
    q0, q1, successor = FakeQueue("w0"), FakeQueue("w1"), FakeQueue("w2")
    slow = FakeActorFuture()
    pool = FakePool([q0, q1], [slow], ["w0", "w2"])  # w1 died
    follower = Follower(pool)
    started = time.monotonic()
    follower.on_membership(set(), {"w1"}, set())
    # The thread is free for other reactions.
    assert time.monotonic() - started < 0.3 + SLACK_S < defaults.CONTROL_CALL_TIMEOUT_S
    assert 1 in pool.table.moving and "workers_lost" in q0.calls
    slow.finish(successor)
    follower.on_membership({"w3"}, set(), set())  # the next event finishes it
    assert pool.table.handles[1] is successor and not pool.table.moving


def test_a_call_waiting_for_a_slow_reopen_installs_it_when_it_is_ready(monkeypatch):
    monkeypatch.setattr(defaults, "SUCCESSOR_WAIT_S", 0.2)
    q0, q1, successor = FakeQueue("w0"), FakeQueue("w1"), FakeQueue("w2")
    slow = FakeActorFuture()
    pool = FakePool([q0, q1], [slow], ["w0", "w2"])
    follower = Follower(pool)
    pool.table.while_moving = lambda: follower.finish_started(blocking=False)
    follower.on_membership(set(), {"w1"}, set())
    threading.Timer(0.3, slow.finish, args=(successor,)).start()
    assert pool.table.current(1) is successor  # no membership event needed


def test_a_failed_reopen_gives_the_queue_up():
    q0 = FakeQueue("w0")
    pool = FakePool([q0, FakeQueue("w1")], [FakeActorFuture(error=RuntimeError("disk"))], ["w0", "w2"])
    Follower(pool).on_membership(set(), {"w1"}, set())
    assert pool.table.lost == {1: "w1"} and not pool.table.moving
