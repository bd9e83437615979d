"""Points 9 and 12 of issue 22: a 0.2.0 consumer (a ``ConsumerBaseClass`` subclass) gets the
raw items ``put_many`` put, one without ``process_item`` is refused at creation, and a
``join`` over tasks that all failed says so."""

from __future__ import annotations

import logging
import warnings

import pytest

from daskqueue import compat
from tests.compat import old_code

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from daskqueue import ConsumerBaseClass, ConsumerPool, DummyConsumer, QueuePool
    from daskqueue.errors import ConfigurationError


@pytest.mark.timeout(180)
def test_an_old_consumer_gets_the_raw_items_as_in_the_copy_example(client):
    """0.2.0's examples/perf_copy.py: ``src, dst = item`` on every item put."""
    queue_pool = QueuePool(client, 1)
    consumer_pool = ConsumerPool(client, queue_pool, old_code.CopyWorker, 2)
    try:
        consumer_pool.start()
        ids = queue_pool.put_many([(f"src{i}", f"dst{i}") for i in range(30)])
        consumer_pool.join()
        results = consumer_pool.results(by_consumer=False)
        assert [results[i] for i in ids] == [f"src{i}->dst{i}" for i in range(30)]
        assert consumer_pool.failures() == {}
    finally:
        consumer_pool.close()
        queue_pool.close()


@pytest.mark.timeout(180)
def test_an_old_consumer_given_a_task_gets_a_message_that_runs_it(client):
    queue_pool = QueuePool(client, 1)
    consumer_pool = ConsumerPool(client, queue_pool, ConsumerClass=old_code.MessageReader, n_consumers=1)
    try:
        task = queue_pool.submit(old_code.add, 2, 3)
        consumer_pool.start()
        consumer_pool.join(timeout=60)
        assert consumer_pool.results(by_consumer=False) == {task: 5}
    finally:
        consumer_pool.close()
        queue_pool.close()


@pytest.mark.timeout(180)
def test_dummy_consumer_logs_each_item(client):
    queue_pool = QueuePool(client, 1)
    consumer_pool = ConsumerPool(client, queue_pool, DummyConsumer, 1)
    try:
        ids = queue_pool.put_many(["a", "b"])
        consumer_pool.start()
        consumer_pool.join(timeout=60)
        assert consumer_pool.results(by_consumer=False) == dict.fromkeys(ids)
    finally:
        consumer_pool.close()
        queue_pool.close()


def test_an_old_process_item_called_directly_gets_its_item():
    class Upper(ConsumerBaseClass):
        def process_item(self, item):
            return item.upper()

    assert Upper.process_item(None, "a") == "A"  # no instance needed: as a plain function


def test_a_consumer_without_process_item_cannot_be_made():
    """0.2.0's tests/test_consumer.py: ``process_item`` is abstract."""

    class Worker(ConsumerBaseClass):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Worker(0, ["queue"])


@pytest.mark.timeout(60)
def test_a_consumer_pool_refuses_a_class_without_process_item_at_creation(client):
    from daskqueue import ConsumerBase

    class NewStyle(ConsumerBase):
        pass

    queue_pool = QueuePool(client, 1)
    try:
        for cls in (old_code.NoProcessItem, NewStyle):
            with pytest.raises(ConfigurationError, match="must implement process_item"):
                ConsumerPool(client, queue_pool, cls, 1)
    finally:
        queue_pool.close()


@pytest.mark.timeout(240)
def test_join_over_tasks_that_all_failed_warns_with_the_count(client, caplog):
    """The trap of issue 22: a 0.2.0 consumer that raised on every item made ``join()``
    return normally with nothing done. It still returns, but says so."""
    queue_pool = QueuePool(client, 1, max_retries=0)
    consumer_pool = ConsumerPool(client, queue_pool, old_code.CopyWorker, 1)
    try:
        queue_pool.put_many(["not a pair", "nor this"])  # src, dst = item fails on both
        consumer_pool.start()
        with caplog.at_level(logging.WARNING, logger="daskqueue"), warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            consumer_pool.join(timeout=120)
        assert any("all 2 messages settled since the last join failed" in r.getMessage() for r in caplog.records)
        [w] = [w for w in record if issubclass(w.category, RuntimeWarning)]
        assert w.filename == __file__ and "failures()" in str(w.message)
        assert len(consumer_pool.failures()) == 2
        queue_pool.put_many([("a", "b")])  # the next join reports only what settled since
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="daskqueue"):
            consumer_pool.join(timeout=120)
        assert not [r for r in caplog.records if "failed" in r.getMessage()]
    finally:
        consumer_pool.close()
        queue_pool.close()
        compat.reset_warnings()
