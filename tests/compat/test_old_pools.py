"""Points 2-8 of issue 22: pools written as daskqueue 0.2.0's tests and examples wrote them
(old import paths, positional arguments, ``Durability``, ``join(0.1)``, nested ``results()``)
run on a real cluster, each old spelling warning once at the caller's line."""

from __future__ import annotations

import contextlib
import time
import warnings

import pytest

from daskqueue import compat
from daskqueue.errors import NotATaskConsumerError
from tests.compat import old_code

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from daskqueue.ConsumerPool import ConsumerPool
    from daskqueue.QueuePool import QueuePool
    from daskqueue.queue.base_queue import Durability


@contextlib.contextmanager
def recorded():
    compat.reset_warnings()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        yield record


def warned(record, text: str) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, DeprecationWarning) and text in str(w.message)]


def flat(res) -> list:
    """How 0.2.0's tests read ``results()``."""
    return [val for k in res for val in res[k].values()]


@contextlib.contextmanager
def closing(*pools):
    try:
        yield
    finally:
        for pool in reversed(pools):
            pool.close()


@pytest.mark.timeout(180)
def test_a_durable_pool_made_with_durability_runs_and_nests_results(client, tmp_path):
    queue_pool = QueuePool(client, 1, durability=Durability.DURABLE, dirpath=str(tmp_path))
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=2)
    with closing(queue_pool, consumer_pool), recorded() as record:
        assert queue_pool.durability == "durable"
        for _ in range(20):
            queue_pool.submit(old_code.func_no_return)
        assert 20 == sum(list(queue_pool.get_queue_size().values()))
        consumer_pool.start()
        consumer_pool.join(timestep=0.2, progress=True)
        res = consumer_pool.results()
        assert 20 * [None] == flat(res)
        assert set(res) == {"GeneralConsumer-0", "GeneralConsumer-1"}
    [nested] = warned(record, "nested by consumer")
    assert nested.filename == __file__
    assert len(warned(record, "join(timestep=")) == 1


@pytest.mark.timeout(180)
def test_join_with_a_positional_interval_waits_for_the_work_instead_of_timing_out(client):
    """0.2.0's ``join(0.1)`` polled every 0.1 s: a 1 s task must not make it raise."""
    queue_pool = QueuePool(client, 1)
    consumer_pool = ConsumerPool(client, queue_pool=queue_pool, n_consumers=1, batch_size=1, early_ack=False)
    with closing(queue_pool, consumer_pool), recorded() as record:
        queue_pool.submit(old_code.sleep_func, 1)
        started = time.perf_counter()
        consumer_pool.start()
        consumer_pool.join(0.1)
        assert time.perf_counter() - started >= 1
        assert [1] == flat(consumer_pool.results())
    [w] = warned(record, "join(0.1)")
    assert "join(timeout=" in str(w.message) and w.filename == __file__


@pytest.mark.timeout(180)
def test_consumer_pool_takes_n_consumers_fourth_and_nests_results(client):
    """0.2.0's examples: ``ConsumerPool(client, queue_pool, ConsumerClass, n_consumers)``."""
    from daskqueue import ConsumerPool as NewConsumerPool, GeneralConsumer, QueuePool as NewQueuePool

    queue_pool = NewQueuePool(client, 1)
    with recorded() as record:
        consumer_pool = NewConsumerPool(client, queue_pool, GeneralConsumer, 2)
    with closing(queue_pool, consumer_pool), recorded() as later:
        assert consumer_pool.n_consumers == 2
        queue_pool.batch_submit([(old_code.add, 1, 1) for _ in range(10)])
        consumer_pool.start()
        consumer_pool.join()
        assert 10 * [2] == flat(consumer_pool.results())  # made with an old spelling: nested
        assert list(consumer_pool.results(by_consumer=False).values()) == 10 * [2]
    [w] = warned(record, "n_consumers=...")
    assert w.filename == __file__
    assert len(warned(later, "nested by consumer")) == 1
    with pytest.raises(TypeError, match="multiple values"):
        NewConsumerPool(client, queue_pool, GeneralConsumer, 2, n_consumers=3)


@pytest.mark.timeout(180)
def test_batch_submit_takes_the_old_options(client):
    from daskqueue import GeneralConsumer

    queue_pool = QueuePool(client, 1)
    with closing(queue_pool), recorded() as record:
        queue_pool.batch_submit([(old_code.add, 1, 2) for _ in range(10)], sync_mode=False,
                                worker_class=GeneralConsumer, batch_size=3)
        queue_pool.batch_submit([(old_code.add, 1, 2) for _ in range(5)], True)  # sync_mode by position
        assert 15 == sum(queue_pool.get_queue_size().values())
        with pytest.raises(RuntimeError, match="GeneralConsumer"):  # as 0.2.0 raised
            queue_pool.batch_submit([(old_code.add, 1, 2)], worker_class=old_code.CopyWorker)
        assert 15 == sum(queue_pool.get_queue_size().values())
    [w] = warned(record, "batch_submit(tasks, sync_mode=")
    assert w.filename == __file__


@pytest.mark.timeout(180)
def test_submit_takes_timeout_and_worker_class_as_options_not_arguments(client):
    from daskqueue import GeneralConsumer

    queue_pool = QueuePool(client, 1)
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=1)
    with closing(queue_pool, consumer_pool), recorded() as record:
        plain = queue_pool.submit(old_code.add, 1, 2, timeout=5, worker_class=GeneralConsumer)
        # A function that takes a timeout gets it, as every keyword of submit is the function's.
        own = queue_pool.submit(old_code.takes_timeout, 1, timeout=5)
        with pytest.raises(NotATaskConsumerError) as raised:
            queue_pool.submit(old_code.add, 1, 2, worker_class=old_code.CopyWorker)
        assert isinstance(raised.value, RuntimeError)
        consumer_pool.start()
        consumer_pool.join()
        results = consumer_pool.results(by_consumer=False)
        assert results == {plain: 3, own: (1, 5)}
        assert consumer_pool.failures() == {}
    [w] = warned(record, "submit(func, ..., timeout=, worker_class=)")
    assert w.filename == __file__


@pytest.mark.timeout(120)
def test_queue_pool_len_and_indexing_answer_as_0_2_0(client):
    queue_pool = QueuePool(client, 2)
    with closing(queue_pool), recorded() as record:
        assert 2 == len(queue_pool)
        assert 0 == sum(queue_pool.get_queue_size().values())
        queue_pool.put_many([1, 2, 3])
        assert sum(queue_pool[i].qsize().result() for i in range(2)) == 3
        assert queue_pool[-1].qsize().result() == queue_pool.get_queue_size()[1]
        with pytest.raises(IndexError):
            _ = queue_pool[3]
        with pytest.raises(AttributeError, match="out of scope"):
            queue_pool[0].get_nowait()
        assert queue_pool  # truthy, as every pool
    assert len(warned(record, "len(queue_pool)")) == 1 and len(warned(record, "queue_pool[i]")) == 1
    assert all(w.filename == __file__ for w in warned(record, "queue_pool"))


@pytest.mark.timeout(120)
def test_a_pool_made_with_todays_spellings_keeps_flat_results(client):
    from daskqueue import ConsumerPool as NewConsumerPool, QueuePool as NewQueuePool

    queue_pool = NewQueuePool(client, 1)
    consumer_pool = NewConsumerPool(client, queue_pool, n_consumers=1)
    with closing(queue_pool, consumer_pool), recorded() as record:
        ids = queue_pool.batch_submit([(old_code.add, i, 1) for i in range(5)])
        consumer_pool.start()
        consumer_pool.join(timeout=60)
        assert consumer_pool.results() == {i: n + 1 for n, i in enumerate(ids)}
    assert not warned(record, "")


def test_the_pools_help_shows_the_current_submit_and_batch_submit():
    # The 0.2.0 overrides take old options off and hand the call on; help() must still show
    # the documented methods and their keyword options, not ``(func, *args, **kwargs)``.
    import inspect

    from daskqueue import QueuePool

    assert "dq_" in QueuePool.submit.__doc__
    assert "keys" in inspect.signature(QueuePool.batch_submit).parameters
