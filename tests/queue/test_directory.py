"""Durable pool directories (daskqueue/queue/directory.py): real files, no cluster."""

from __future__ import annotations

import json

import pytest

from daskqueue.errors import ConfigurationError, ForeignDirectoryError
from daskqueue.queue.directory import POOL_FILE, prepare_pool_dir


def test_a_new_pool_directory_records_its_shape_and_names_one_directory_per_queue(tmp_path):
    dirs = prepare_pool_dir(str(tmp_path / "pool"), 3)
    assert dirs == [str(tmp_path / "pool" / f"queue-00{i}") for i in range(3)]
    assert json.loads((tmp_path / "pool" / POOL_FILE).read_text()) == {"format": 1, "n_queues": 3}


def test_a_pool_may_reopen_with_more_queues_but_not_fewer(tmp_path):
    path = str(tmp_path)
    prepare_pool_dir(path, 2)
    assert len(prepare_pool_dir(path, 4)) == 4
    with pytest.raises(ConfigurationError, match="n_queues >= 4"):
        prepare_pool_dir(path, 3)


def test_a_foreign_directory_or_a_file_is_refused(tmp_path):
    (tmp_path / "someone-elses.txt").write_text("hello")
    with pytest.raises(ForeignDirectoryError):
        prepare_pool_dir(str(tmp_path), 1)
    with pytest.raises(ConfigurationError, match="not a directory"):
        prepare_pool_dir(str(tmp_path / "someone-elses.txt"), 1)


def test_an_unknown_pool_file_format_is_refused(tmp_path):
    (tmp_path / POOL_FILE).write_text(json.dumps({"format": 99, "n_queues": 1}))
    with pytest.raises(ConfigurationError, match="unknown format"):
        prepare_pool_dir(str(tmp_path), 1)
