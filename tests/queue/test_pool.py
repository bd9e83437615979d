"""QueuePool: validation, bad input, representation, closing."""

from __future__ import annotations

import pytest

from daskqueue import (
    ConfigurationError,
    ConsumerPool,
    InvalidTaskError,
    PayloadTooLargeError,
    QueueClosedError,
    QueuePool,
    RemoteTaskError,
    SerializationError,
)
from tests import tasks


@pytest.mark.parametrize("n_queues", [0, -1, 1.5, "2", True])
def test_bad_n_queues_is_a_configuration_error(client, n_queues):
    with pytest.raises(ConfigurationError, match="n_queues"):
        QueuePool(client, n_queues)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"lease_timeout_s": 0}, "lease_timeout_s"),
        ({"max_retries": -1}, "max_retries"),
        ({"durability": "forever"}, "durability"),
        ({"max_message_bytes": 0}, "max_message_bytes"),
    ],
)
def test_bad_pool_options_name_the_option(client, kwargs, name):
    with pytest.raises(ConfigurationError, match=name):
        QueuePool(client, 1, **kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"n_consumers": -1}, "n_consumers"),
        ({"n_consumers": 0}, "n_consumers"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"batch_size": 0}, "batch_size"),
        ({"ConsumerClass": dict}, "ConsumerClass"),
    ],
)
def test_bad_consumer_pool_options_name_the_option(pools, client, kwargs, name):
    qp = pools.queue(1)
    with pytest.raises(ConfigurationError, match=name):
        ConsumerPool(client, qp, **kwargs)


def test_unpicklable_argument_names_the_task_and_sends_nothing(pools):
    qp = pools.queue(2, put_batch_size=10)
    batch = [(tasks.double, i) for i in range(50)]
    batch[37] = (tasks.double, tasks.Unpicklable())
    with pytest.raises(SerializationError, match="task 37") as info:
        qp.batch_submit(batch)
    assert info.value.index == 37
    assert sum(s.total_put for s in qp.stats()) == 0


def test_unpicklable_function_is_a_serialization_error(pools):
    qp = pools.queue(1)
    with pytest.raises(SerializationError, match="cannot pickle function"):
        qp.submit(tasks.Unpicklable().__reduce__)  # a bound method of an unpicklable object
    assert sum(s.total_put for s in qp.stats()) == 0


def test_non_callable_is_an_invalid_task_naming_its_index(pools):
    qp = pools.queue(1)
    with pytest.raises(InvalidTaskError, match="task 1"):
        qp.batch_submit([(tasks.double, 1), (42, 1)])
    with pytest.raises(InvalidTaskError):
        qp.batch_submit([tasks.double])  # not a tuple
    with pytest.raises(InvalidTaskError):
        qp.submit("not callable")
    assert sum(s.total_put for s in qp.stats()) == 0


def test_oversized_message_is_refused_before_sending(pools):
    qp = pools.queue(1, max_message_bytes=1000)
    with pytest.raises(PayloadTooLargeError, match="task 1"):
        qp.batch_submit([(tasks.double, 1), (tasks.double, b"x" * 5000)])
    with pytest.raises(PayloadTooLargeError):
        qp.put(b"y" * 5000)
    assert sum(s.total_put for s in qp.stats()) == 0


def test_submit_after_close_raises_queue_closed(pools):
    qp = pools.queue(1)
    qp.close()
    with pytest.raises(QueueClosedError):
        qp.submit(tasks.double, 1)
    with pytest.raises(QueueClosedError):
        qp.put_many([1])
    qp.close()  # idempotent


def test_bad_priority_and_delay_are_configuration_errors(pools):
    qp = pools.queue(1)
    with pytest.raises(ConfigurationError, match="priority"):
        qp.batch_submit([(tasks.double, 1)], priority="high")
    with pytest.raises(ConfigurationError, match="delay_s"):
        qp.put(1, delay_s=-1)


def test_repr_and_html_show_the_pool(pools):
    qp = pools.queue(2)
    qp.batch_submit([(tasks.double, 1)] * 3)
    assert "2 transient queues" in repr(qp)
    html = qp._repr_html_()
    assert "<table" in html and "ready" in html and ">3<" in html
    assert sum(qp.get_queue_size().values()) == 3


def test_queue_handles_call_their_workers_directly_not_through_the_scheduler(pools):
    from distributed.actor import Actor

    from daskqueue.queue.handles import DirectActor

    qp = pools.queue(2)
    assert all(isinstance(q, DirectActor) for q in qp.queues)
    assert all(q._worker_rpc.address == q._address for q in qp.queues)
    cp = pools.consumer(qp, n_consumers=1)
    cp.start()
    assert qp.map(tasks.double, range(100)) == [2 * i for i in range(100)]
    forced = pools.queue(1, direct_to_workers=False)
    assert type(forced.queues[0]) is Actor
    forced.put_many(range(3))
    assert forced.stats()[0].ready == 3


def test_unreachable_worker_falls_back_to_the_scheduler_proxy(pools, caplog):
    from distributed.actor import Actor

    from daskqueue.queue.handles import direct_handles

    qp = pools.queue(1, direct_to_workers=False)
    good = qp.queues[0]
    # The same actor, as if its worker's address could not be reached from the client.
    unreachable = Actor(good._cls, "tcp://127.0.0.1:9", good.key)
    with caplog.at_level("WARNING", logger="daskqueue"):
        handles = direct_handles([unreachable], probe_timeout_s=1.0)
    assert handles == [unreachable]
    assert "through the scheduler" in caplog.text


@pytest.mark.timeout(60)
def test_plain_handles_call_through_the_pools_client_not_dasks_current_one(pools, client):
    """A pool with ``direct_to_workers=False``, or whose probe fell back to the scheduler,
    keeps plain handles: they too must call through the pool's own client (a queue's
    successor handle came back bound to whichever client Dask held current)."""
    from distributed import Client
    from distributed.actor import Actor

    from daskqueue.queue.handles import direct_handles

    qp = pools.queue(1, direct_to_workers=False)
    good = qp.queues[0]
    with Client(client.scheduler.address, set_as_default=False, timeout=30) as other:
        plain = Actor(good._cls, good._address, good.key)  # bound to the current (session) client
        assert plain._client is client
        (kept,) = direct_handles([plain], client=other, direct=False)
        assert kept._client is other and kept._future.client is other
        unreachable = Actor(good._cls, "tcp://127.0.0.1:9", good.key)
        (fallen_back,) = direct_handles([unreachable], client=other, probe_timeout_s=1.0)
        assert fallen_back._client is other and fallen_back._future.client is other


def test_map_with_a_bad_priority_is_refused_before_anything_is_put(pools):
    qp = pools.queue(1)
    with pytest.raises(ConfigurationError, match="priority"):
        qp.map(tasks.double, range(5), priority="high")
    with pytest.raises(ConfigurationError, match="priority"):
        qp.batch_submit([(tasks.double, 1)], priority=2**40)
    with pytest.raises(ConfigurationError, match="type"):
        qp.put_many([1], type=7)
    assert qp.stats()[0].total_put == 0



def test_a_durable_group_split_over_segments_keeps_one_id_per_task(pools, tmp_path):
    qp = pools.queue(1, durability="durable", dirpath=tmp_path / "pool", max_segment_bytes=65536)
    payload = b"x" * 1000  # 200 tasks of 1 KB: more than one 64 KiB segment record
    ids = qp.batch_submit([(tasks.double, payload) for _ in range(200)])
    assert len(ids) == len(set(ids)) == 200
    assert qp.stats()[0].total_put == 200
    cp = pools.consumer(qp, n_consumers=1)
    cp.start()
    assert qp.map(len, [payload] * 150, timeout_s=60) == [1000] * 150
    cp.join(timeout=60)
    results = cp.results()
    assert all(results[i] == 2 * payload for i in ids)


def test_a_result_too_big_for_a_durable_segment_is_a_clear_failure_not_a_loss(pools, tmp_path):
    qp = pools.queue(1, durability="durable", dirpath=tmp_path / "pool", max_segment_bytes=65536)
    cp = pools.consumer(qp, n_consumers=1)
    cp.start()
    out = qp.map(tasks.double, [b"y" * 50, b"z" * 40_000], errors="return", timeout_s=60)
    assert out[0] == b"y" * 100
    assert isinstance(out[1], RemoteTaskError)
    assert "PayloadTooLargeError" in out[1].exc_type


def test_only_dasks_own_lost_worker_errors_count_as_a_lost_queue():
    from daskqueue.queue.handles import is_lost_worker

    assert is_lost_worker(OSError("Unable to contact Actor's worker"))
    assert is_lost_worker(RuntimeError("Worker holding Actor was lost.  Status: error"))
    assert not is_lost_worker(OSError(28, "No space left on device"))  # raised by the queue itself
    assert not is_lost_worker(RuntimeError("something else"))


def test_the_queue_pool_owns_results_failures_and_waiting_for_one(pools):
    qp = pools.queue(2)
    ok = qp.batch_submit([(tasks.double, i) for i in range(10)])
    bad = qp.submit(tasks.boom, 1)
    cp = pools.consumer(qp, n_consumers=1)
    cp.start()
    assert qp.result(ok[3], timeout_s=60) == 6
    with pytest.raises(RemoteTaskError):
        qp.result(bad, timeout_s=60)
    cp.join(timeout=60)
    assert {i: qp.results()[i] for i in ok} == {i: 2 * k for k, i in enumerate(ok)}
    assert list(qp.failures()) == [bad]
    assert qp.poll_outcomes() == 0  # everything has been fetched already
    assert cp.results() == qp.results() and cp.failures() == qp.failures()


def test_result_of_an_id_from_another_pool_is_a_configuration_error(pools):
    from daskqueue import make_id

    qp = pools.queue(1)
    with pytest.raises(ConfigurationError, match="task_id"):
        qp.result(make_id(5, 0), timeout_s=1)


def test_a_durable_pool_accepts_the_stores_minimum_segment_and_caps_messages_to_it(pools, tmp_path):
    from daskqueue import defaults

    with pytest.raises(ConfigurationError, match="max_segment_bytes"):
        pools.queue(1, durability="durable", dirpath=tmp_path / "a", max_segment_bytes=defaults.MIN_SEGMENT_BYTES - 1)
    qp = pools.queue(1, durability="durable", dirpath=tmp_path / "b", max_segment_bytes=defaults.MIN_SEGMENT_BYTES)
    assert 0 < qp.max_message_bytes < defaults.MIN_SEGMENT_BYTES
    qp.put(b"x" * 100)
    with pytest.raises(PayloadTooLargeError):
        qp.put(b"x" * defaults.MIN_SEGMENT_BYTES)
    assert qp.stats()[0].total_put == 1

