"""A Hypothesis state machine over ``QueueCore``, checked against a plain per-message model.

The model tracks every message by sequence number (state, attempts, priority, when it is due)
and predicts exactly what each call returns: which messages ``get_batch`` leases and in what
order, what ``settle`` acks, retries, dead-letters and releases, what ``expire`` takes back,
which ids ``extend`` does not know, and ``next_wakeup``. Backoff jitter is 0 so the model can
compute retry times itself, and every time step is a binary fraction so sums of times are exact.

The core's ``journal`` is on, and replaying it (plus the puts, which the shell records itself)
must give every message the state and attempts the model has, with a promoted delayed message
counted as waiting either way: a durable shell rebuilds the queue from exactly this.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from daskqueue.queue.core import LEASE_EXPIRED, QueueCore, Transition

LEASE_TIMEOUT_S = 1.0
BACKOFF_BASE_S = 0.125
BACKOFF_MAX_S = 0.5
UNKNOWN_LEASE_ID = 10**9

READY, DELAYED, LEASED, ACKED, DEAD = "ready", "delayed", "leased", "acked", "dead"


@dataclass
class Msg:
    seq: int
    priority: int
    state: str
    attempts: int = 0
    not_before: float = 0.0
    delay_order: int = 0  # tie-breaker among delayed messages due at the same time
    fatal: bool = False


@dataclass
class ModelLease:
    seqs: list[int]
    deadline: float
    owner: str | None = None


class QueueModel:
    """The queue as plain lists and dicts, one entry per message."""

    def __init__(self, max_retries: int) -> None:
        self.max_retries = max_retries
        self.now = 0.0
        self.msgs: dict[int, Msg] = {}
        self.ready: dict[int, list[int]] = {}  # priority -> seqs, FIFO
        self.leases: dict[int, ModelLease] = {}
        self.gone_lease_ids: list[int] = []  # settled or expired
        self.dead: list[tuple[int, int, bytes]] = []  # (seq, attempts, error)
        self.delay_orders = 0
        self.total_put = self.total_acked = self.total_retried = self.total_expired = 0
        self.total_taken_back = 0

    def in_state(self, state: str) -> list[int]:
        return [m.seq for m in self.msgs.values() if m.state == state]

    def put(self, seqs: list[int], priority: int, not_before: float | None) -> None:
        self.total_put += len(seqs)
        for seq in seqs:
            self.msgs[seq] = msg = Msg(seq, priority, READY)
            if not_before is not None and not_before > self.now:
                self._delay(msg, not_before)
            else:
                self.ready.setdefault(priority, []).append(seq)

    def _delay(self, msg: Msg, not_before: float) -> None:
        msg.state, msg.not_before = DELAYED, not_before
        msg.delay_order = self.delay_orders = self.delay_orders + 1

    def promote_due(self) -> None:
        due = [m for m in self.msgs.values() if m.state == DELAYED and m.not_before <= self.now]
        for msg in sorted(due, key=lambda m: (m.not_before, m.delay_order)):
            msg.state = READY
            self.ready.setdefault(msg.priority, []).append(msg.seq)

    def take(self, max_items: int) -> list[int]:
        """Remove and return the next ``max_items`` ready messages, highest priority first."""
        taken: list[int] = []
        for prio in sorted(self.ready, reverse=True):
            queue = self.ready[prio]
            n = min(len(queue), max_items - len(taken))
            taken += queue[:n]
            del queue[:n]
        self.ready = {p: q for p, q in self.ready.items() if q}
        for seq in taken:
            assert self.msgs[seq].state == READY, f"{seq} leased while {self.msgs[seq].state}"
            self.msgs[seq].state = LEASED
        return taken

    def fail(self, seq: int, error: bytes, *, fatal: bool = False) -> bool:
        """Retry or dead-letter a leased message; return True if dead-lettered."""
        msg = self.msgs[seq]
        msg.attempts += 1
        if fatal or msg.attempts > self.max_retries:
            msg.state, msg.fatal = DEAD, fatal
            self.dead.append((seq, msg.attempts, error))
            return True
        delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0 ** (msg.attempts - 1))
        self.total_retried += 1
        self._delay(msg, self.now + delay)
        return False

    def release(self, seqs: list[int]) -> None:
        """Put leased messages back at the front of their priority, in lease order."""
        for prio in {self.msgs[s].priority for s in seqs}:
            front = [s for s in seqs if self.msgs[s].priority == prio]
            self.ready[prio] = front + self.ready.get(prio, [])
        for seq in seqs:
            self.msgs[seq].state = READY

    def next_wakeup(self) -> float | None:
        times = [lease.deadline for lease in self.leases.values()]
        times += [m.not_before for m in self.msgs.values() if m.state == DELAYED]
        return min(times, default=None)


def lease_seqs(lease) -> list[int]:
    return [s.chunk.base_seq + i for s in lease.spans for i in range(s.start, s.stop)]


def lease_attempts(lease) -> list[int]:
    return [s.attempts for s in lease.spans for _ in range(s.start, s.stop)]


class QueueCoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core: QueueCore | None = None
        self.model: QueueModel | None = None
        self.journaled: dict[int, tuple[str, int]] = {}  # seq -> (state, attempts) from replay

    @initialize(max_retries=st.integers(0, 3), seed=st.integers(0, 3))
    def make_core(self, max_retries, seed):
        self.core = QueueCore(
            lease_timeout_s=LEASE_TIMEOUT_S,
            max_retries=max_retries,
            retry_backoff_base_s=BACKOFF_BASE_S,
            retry_backoff_max_s=BACKOFF_MAX_S,
            retry_backoff_jitter=0.0,
            seed=seed,
        )
        self.core.journal = []
        self.model = QueueModel(max_retries)

    # -- rules ---------------------------------------------------------------------------------

    @rule(
        count=st.integers(1, 6) | st.just(40),
        priority=st.sampled_from([0, 0, 1, -2]),
        delay_s=st.none() | st.sampled_from([0.0, 0.25, 1.5]),
    )
    def put(self, count, priority, delay_s):
        m = self.model
        payload = ("payload", self.core.next_seq)
        chunk = self.core.new_chunk(count, priority=priority, payload=payload)
        seqs = list(range(chunk.base_seq, chunk.base_seq + count))
        assert chunk.base_seq == len(m.msgs), "sequence numbers must be consecutive"
        not_before = None if delay_s is None else m.now + delay_s
        self.core.put(chunk, now=m.now, not_before=not_before)
        m.put(seqs, priority, not_before)
        self.journaled.update((seq, ("waiting", 0)) for seq in seqs)

    @rule(max_items=st.integers(1, 8) | st.just(100), owner=st.sampled_from([None, "w1", "w2"]))
    def get_batch(self, max_items, owner):
        m = self.model
        m.promote_due()
        settled = {*m.in_state(ACKED), *m.in_state(DEAD)}
        expected = m.take(max_items)
        lease = self.core.get_batch(max_items, now=m.now, owner=owner)
        if not expected:
            assert lease is None
            return
        assert lease is not None
        assert settled.isdisjoint(lease_seqs(lease)), "a settled message came back"
        assert lease_seqs(lease) == expected
        assert lease_attempts(lease) == [m.msgs[s].attempts for s in expected]
        assert all(s.chunk.payload == ("payload", s.chunk.base_seq) for s in lease.spans)
        assert (lease.count, lease.deadline) == (len(expected), m.now + LEASE_TIMEOUT_S)
        assert lease.lease_id not in m.leases and lease.lease_id not in m.gone_lease_ids
        m.leases[lease.lease_id] = ModelLease(expected, lease.deadline, owner)

    @precondition(lambda self: self.model and self.model.leases)
    @rule(data=st.data())
    def settle(self, data):
        m = self.model
        lease_id = data.draw(st.sampled_from(sorted(m.leases)), label="lease_id")
        seqs = m.leases[lease_id].seqs
        done = data.draw(st.integers(0, len(seqs)), label="done")
        failed = data.draw(st.sets(st.integers(0, done - 1)) if done else st.just(set()))
        fatal = data.draw(st.sets(st.sampled_from(sorted(failed))) if failed else st.just(set()))
        errors = {pos: b"error %d at %d" % (pos, lease_id) for pos in failed}

        journaled = len(self.core.journal)
        result = self.core.settle(lease_id, done=done, errors=errors, fatal=fatal, now=m.now)
        new_entries = self.core.journal[journaled:]

        del m.leases[lease_id]
        m.gone_lease_ids.append(lease_id)
        acked, n_retried, n_dead = [], 0, 0
        for pos, seq in enumerate(seqs[:done]):
            if pos in errors:
                if m.fail(seq, errors[pos], fatal=pos in fatal):
                    n_dead += 1
                else:
                    n_retried += 1
            else:
                m.msgs[seq].state = ACKED
                acked.append(seq)
        m.total_acked += len(acked)
        m.release(seqs[done:])
        acked_spans = [e.span for e in new_entries if e.kind == Transition.ACK]
        assert [s.chunk.base_seq + i for s in acked_spans for i in range(s.start, s.stop)] == acked
        assert (result.n_acked, result.n_retried, result.n_dead, result.n_released) == (
            len(acked),
            n_retried,
            n_dead,
            len(seqs) - done,
        )

    @rule(data=st.data())
    def settle_an_unknown_lease_raises_and_changes_nothing(self, data):
        m = self.model
        lease_id = data.draw(st.sampled_from([UNKNOWN_LEASE_ID, *m.gone_lease_ids]))
        before = self.core.stats()
        with pytest.raises(KeyError):
            self.core.settle(lease_id, done=0, now=m.now)
        assert self.core.stats() == before

    @precondition(lambda self: self.model and self.model.leases)
    @rule(data=st.data())
    def settle_with_bad_positions_raises_and_keeps_the_lease(self, data):
        m = self.model
        lease_id = data.draw(st.sampled_from(sorted(m.leases)), label="lease_id")
        count = len(m.leases[lease_id].seqs)
        bad_calls = [
            (-1, {}),
            (count + 1, {}),
            (count, {count: b"e"}),
            (0, {0: b"e"}),
            (count, {-1: b"e"}),
        ]
        done, errors = data.draw(st.sampled_from(bad_calls), label="done, errors")
        before = self.core.stats()
        with pytest.raises(ValueError):
            self.core.settle(lease_id, done=done, errors=errors, now=m.now)
        assert self.core.stats() == before
        assert lease_seqs(self.core.lease(lease_id)) == m.leases[lease_id].seqs

    @rule(data=st.data())
    def extend(self, data):
        m = self.model
        known = [UNKNOWN_LEASE_ID, *sorted(m.leases), *m.gone_lease_ids]
        ids = data.draw(st.lists(st.sampled_from(known), max_size=4), label="ids")
        unknown = self.core.extend(ids, now=m.now)
        assert unknown == [i for i in ids if i not in m.leases]
        for lease_id in ids:
            if lease_id in m.leases:
                lease = m.leases[lease_id]
                lease.deadline = max(lease.deadline, m.now + LEASE_TIMEOUT_S)
                assert self.core.lease(lease_id).deadline == lease.deadline

    @rule(dt=st.sampled_from([0.0625, 0.25, 0.5, 1.0, 3.0]))
    def advance_time(self, dt):
        self.model.now += dt

    @rule()
    def expire(self):
        m = self.model
        due = sorted((ls.deadline, i) for i, ls in m.leases.items() if ls.deadline <= m.now)
        n = 0
        for _, lease_id in due:
            seqs = m.leases.pop(lease_id).seqs
            m.gone_lease_ids.append(lease_id)
            for seq in seqs:
                m.fail(seq, LEASE_EXPIRED)
            n += len(seqs)
        m.total_expired += n
        assert self.core.expire(now=m.now) == n

    @rule(owners=st.sets(st.sampled_from(["w1", "w2", "w3"]), max_size=2))
    def take_back_the_leases_of_lost_workers(self, owners):
        m = self.model
        gone = sorted(i for i, ls in m.leases.items() if ls.owner in owners)
        n = 0
        for lease_id in gone:
            seqs = m.leases.pop(lease_id).seqs
            m.gone_lease_ids.append(lease_id)
            for seq in seqs:
                m.fail(seq, b"worker lost")
            n += len(seqs)
        m.total_taken_back += n
        assert self.core.take_back(frozenset(owners), b"worker lost", now=m.now) == n

    @rule()
    def has_ready(self):
        m = self.model
        m.promote_due()
        assert self.core.has_ready(m.now) == bool(m.in_state(READY))

    @rule()
    def next_wakeup(self):
        assert self.core.next_wakeup() == self.model.next_wakeup()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def replaying_the_journal_gives_the_model_state(self):
        if self.core is None:
            return
        entries, self.core.journal = self.core.journal, []
        m = self.model
        states = {
            Transition.LEASE: LEASED, Transition.RELEASE: "waiting", Transition.RETRY: "waiting",
            Transition.ACK: ACKED, Transition.DEAD: DEAD,
        }
        for entry in entries:
            span = entry.span
            for i in range(span.start, span.stop):
                seq = span.chunk.base_seq + i
                self.journaled[seq] = (states[entry.kind], span.attempts)
                if entry.kind == Transition.RETRY:
                    assert entry.time == m.msgs[seq].not_before
                elif entry.kind == Transition.DEAD:
                    assert (seq, span.attempts, entry.error) in m.dead
        waiting = {READY: "waiting", DELAYED: "waiting"}
        expected = {s: (waiting.get(msg.state, msg.state), msg.attempts) for s, msg in m.msgs.items()}
        assert self.journaled == expected

    @invariant()
    def core_validates(self):
        if self.core is not None:
            self.core.validate()

    @invariant()
    def stats_match_the_model(self):
        if self.core is None:
            return
        m, s = self.model, self.core.stats()
        assert (s.ready, s.delayed, s.leased, s.dead) == (
            len(m.in_state(READY)),
            len(m.in_state(DELAYED)),
            len(m.in_state(LEASED)),
            len(m.in_state(DEAD)),
        )
        assert (s.total_put, s.total_acked, s.total_retried, s.total_expired, s.total_taken_back) == (
            m.total_put,
            m.total_acked,
            m.total_retried,
            m.total_expired,
            m.total_taken_back,
        )

    @invariant()
    def every_message_is_in_exactly_one_state(self):
        if self.model is None:
            return
        m = self.model
        assert sorted(m.msgs) == list(range(self.core.next_seq))
        ready = [s for q in m.ready.values() for s in q]
        leased = [s for lease in m.leases.values() for s in lease.seqs]
        assert sorted(ready) == sorted(m.in_state(READY))
        assert sorted(leased) == sorted(m.in_state(LEASED))
        assert len(set(leased)) == len(leased)
        states = (READY, DELAYED, LEASED, ACKED, DEAD)
        assert sum(len(m.in_state(state)) for state in states) == len(m.msgs)

    @invariant()
    def live_leases_match_the_model_and_never_overlap(self):
        if self.core is None:
            return
        held: set[int] = set()
        for lease_id, expected in self.model.leases.items():
            lease = self.core.lease(lease_id)
            assert lease is not None and lease_seqs(lease) == expected.seqs
            assert lease.deadline == expected.deadline
            assert held.isdisjoint(lease_seqs(lease)), "a message is leased twice at once"
            held.update(lease_seqs(lease))
        for lease_id in self.model.gone_lease_ids:
            assert self.core.lease(lease_id) is None

    @invariant()
    def dead_letters_match_the_model(self):
        if self.core is None:
            return
        m = self.model
        assert [(d.seq, d.attempts, d.error) for d in self.core.dead] == m.dead
        for d in self.core.dead:
            assert d.seq == d.chunk.base_seq + d.index
            assert d.attempts > m.max_retries or m.msgs[d.seq].fatal


#: Examples of the default run (about 0.05 s of CPU each); the ``slow``-marked run below
#: keeps the long search (``-m slow``).
QueueCoreMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestQueueCoreMachine = QueueCoreMachine.TestCase


@pytest.mark.slow
@pytest.mark.timeout(1200)
class TestQueueCoreMachineThorough(QueueCoreMachine.TestCase):
    """The same machine, searched five times longer than the default run."""

    settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
