"""PoolConfig (daskqueue/queue/config.py) and the validation helper it shares with every
constructor (daskqueue/validate.py): pure, no cluster."""

from __future__ import annotations

import math

import pytest

from daskqueue import defaults
from daskqueue.errors import ConfigurationError
from daskqueue.queue.config import CHUNK_RECORD_OVERHEAD, PoolConfig
from daskqueue.validate import check_choice, check_number, check_optional_str


@pytest.mark.parametrize(
    "options, name",
    [
        ({"n_queues": 0}, "n_queues"),
        ({"n_queues": 2**16 + 1}, "n_queues"),
        ({"durability": "forever"}, "durability"),
        ({"durability": "durable"}, "dirpath"),
        ({"dirpath": "/tmp/x"}, "dirpath"),
        ({"fsync": "sometimes"}, "fsync"),
        ({"fsync_interval_s": 0}, "fsync_interval_s"),
        ({"max_segment_bytes": defaults.MIN_SEGMENT_BYTES - 1}, "max_segment_bytes"),
        ({"compact_index_bytes": 0}, "compact_index_bytes"),
        ({"lease_timeout_s": -1}, "lease_timeout_s"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"retry_backoff_base_s": -0.1}, "retry_backoff_base_s"),
        ({"max_message_bytes": True}, "max_message_bytes"),
        ({"put_batch_size": 0}, "put_batch_size"),
    ],
)
def test_a_bad_setting_is_a_configuration_error_naming_it_and_its_value(options, name):
    with pytest.raises(ConfigurationError, match=name) as info:
        PoolConfig(**options)
    assert isinstance(info.value, ValueError)


def test_from_options_makes_dirpath_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = PoolConfig.from_options(2, durability="durable", dirpath="pool")
    assert config.dirpath == str(tmp_path / "pool") and config.n_queues == 2


def test_a_durable_message_must_fit_in_one_log_segment_with_its_chunk_strings():
    config = PoolConfig(durability="durable", dirpath="/p", max_segment_bytes=defaults.MIN_SEGMENT_BYTES)
    assert config.message_limit() == defaults.MIN_SEGMENT_BYTES - CHUNK_RECORD_OVERHEAD
    assert config.message_limit("ab", "c") == config.message_limit() - 3
    assert config.queue_kwargs()["max_message_bytes"] == config.message_limit()
    transient = PoolConfig(max_message_bytes=10)
    assert transient.message_limit("a long type", "key") == 10


def test_queue_kwargs_carry_storage_settings_only_for_durable_queues():
    assert "fsync" not in PoolConfig().queue_kwargs()
    durable = PoolConfig(durability="durable", dirpath="/p", fsync="always").queue_kwargs()
    assert durable["fsync"] == "always" and durable["max_segment_bytes"] == defaults.MAX_SEGMENT_BYTES


def test_check_number_bounds_kinds_and_none():
    assert check_number("x", 0, at_least=0) == 0
    assert check_number("x", None, integer=True, none_ok=True) is None
    for value, bounds in [(0, {"above": 0}), (True, {}), (1.0, {"integer": True}), (math.nan, {}),
                          (5, {"at_most": 4}), ("1", {})]:
        with pytest.raises(ConfigurationError, match=f"x must be .*got {value!r}"):
            check_number("x", value, **bounds)


def test_check_choice_and_optional_str_name_the_value():
    assert check_choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(ConfigurationError, match="mode must be one of 'a', 'b', got 'c'"):
        check_choice("mode", "c", ("a", "b"))
    assert check_optional_str("type", None) is None
    with pytest.raises(ConfigurationError, match="type must be a str or None, got 7"):
        check_optional_str("type", 7)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("slots, queues", [
    (0, 1),      # no worker yet (adaptive cluster): one queue, more with add_queues
    (2, 1),      # the 2 x 1 test and benchmark clusters keep their single queue
    (25, 1),     # 25 slots x 40 calls/s = 1,000 calls/s: one queue's share
    (26, 2),
    (32, 2),     # 32 workers x 1 thread
    (3200, 32),  # 100 workers x 32 threads: capped (the client polls every queue)
    (32000, 32),
])
def test_the_default_queue_count_follows_the_scale_model(slots, queues):
    from daskqueue.queue.config import default_n_queues

    assert default_n_queues(slots) == queues
