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


def test_new_pool_and_queue_directories_are_the_owners_only(tmp_path):
    import stat

    from daskqueue.queue.directory import prepare_pool_dir
    from daskqueue.segment.store import SegmentStore

    pool = tmp_path / "pool"
    (qdir,) = prepare_pool_dir(str(pool), 1)
    store = SegmentStore(qdir)
    try:
        assert stat.S_IMODE(pool.stat().st_mode) == 0o700
        assert stat.S_IMODE((pool / "queue-000").stat().st_mode) == 0o700
        files = [p for p in (pool / "queue-000").iterdir() if p.name.endswith((".lock", ".log", ".idx"))
                 or p.name.startswith(("log", "index", "LOCK", "lock"))]
        assert files
        for p in files:
            assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p
    finally:
        store.close()
    shared = tmp_path / "shared"
    (sdir,) = prepare_pool_dir(str(shared), 1, mode=0o750)
    store = SegmentStore(sdir, dir_mode=0o750)
    try:
        assert stat.S_IMODE(shared.stat().st_mode) == 0o750
        assert stat.S_IMODE((shared / "queue-000").stat().st_mode) == 0o750
    finally:
        store.close()


def test_a_pool_file_that_is_not_json_is_a_typed_error_naming_the_path(tmp_path):
    from daskqueue.errors import CorruptPoolFileError, StoreError
    from daskqueue.queue.directory import record_removed, removed_queues

    meta = tmp_path / POOL_FILE
    for text in ['{"format": 1, "n_q', "[1, 2]", '{"format": 1, "n_queues": "two"}', "\udcff"]:
        meta.write_bytes(text.encode("utf-8", "surrogateescape"))
        for call in (lambda: prepare_pool_dir(str(tmp_path), 2), lambda: removed_queues(str(tmp_path)),
                     lambda: record_removed(str(tmp_path), 0)):
            with pytest.raises(CorruptPoolFileError, match=POOL_FILE) as caught:
                call()
            assert isinstance(caught.value, StoreError) and caught.value.path == str(meta)


def test_a_pool_file_that_cannot_be_read_or_written_is_a_store_error_naming_the_path(tmp_path):
    # Running as root, no permission bit refuses: a directory where a file should be does.
    from daskqueue.errors import StoreIOError
    from daskqueue.queue.directory import record_removed, removed_queues

    (tmp_path / POOL_FILE).mkdir()
    with pytest.raises(StoreIOError, match=POOL_FILE) as caught:
        removed_queues(str(tmp_path))
    assert isinstance(caught.value.__cause__, OSError)

    pool = str(tmp_path / "pool")
    prepare_pool_dir(pool, 1)
    (tmp_path / "pool" / (POOL_FILE + ".tmp")).mkdir()  # the pool file is written there, then renamed
    with pytest.raises(StoreIOError, match=POOL_FILE) as caught:
        record_removed(pool, 0)
    assert isinstance(caught.value.__cause__, OSError)
