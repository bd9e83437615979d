"""The error taxonomy: one root, and every error survives the trip between processes
(pickled) with its message and its attributes."""

from __future__ import annotations

import pickle

import pytest

from daskqueue import errors
from daskqueue.errors import DaskQueueError

pytestmark = pytest.mark.timeout(30)

#: One instance of each error whose constructor takes arguments, built as the code raises it.
BUILT = [
    errors.SerializationError("cannot pickle", index=3),
    errors.PayloadTooLargeError(2_000, 1_000, index=4),
    errors.PayloadTooLargeError(2_000, 1_000),
    errors.FieldTooLongError("type", 70_000, 65_535),
    errors.QueueLostError(1, "tcp://w:1", "transient", lost_messages=7),
    errors.QueueLostError(1, "tcp://w:1", "durable"),
    errors.QueueMovedError(2, "tcp://w:2"),
    errors.QueueHandedOffError(3, "tcp://w:3"),
    errors.SchedulerLostError("closed", "/data/pool"),
    errors.LeaseExpiredError(99),
    errors.UnknownFunctionsError([b"d1", b"d2"]),
    errors.PackedGroupRefusedError(2, "durable"),
    errors.JoinTimeoutError(1.5, {"pending": 3}),
    errors.QueueCallTimeoutError(0, "stats", 2.0, "tcp://w:4"),
    errors.RemoteTaskError(5, "builtins.ValueError", "bad", "Traceback...", 3),
    errors.CorruptPoolFileError("/p/daskqueue-pool.json", "not JSON"),
    errors.FormatVersionError("/p/index", 9, 1),
    errors.CorruptRecordError("/p/log", 128, "bad checksum", 64),
    errors.StoreIOError("/p/log", "fsync", 5, "EIO"),
    errors.StorePermissionError("/p/log", "open", 13, "EACCES"),
]


def test_every_exported_error_is_a_daskqueue_error():
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), DaskQueueError), name


@pytest.mark.parametrize("error", BUILT, ids=lambda e: type(e).__name__)
def test_an_error_pickles_with_its_message_and_attributes(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert vars(back) == vars(error)
    for name in ("durability", "lost_messages"):  # what QueueLostError's subclasses answer too
        assert getattr(back, name, None) == getattr(error, name, None)
