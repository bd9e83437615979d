"""remove_queue hands an attached producer's unread records on, or stops: never closes them
away (review finding 9: one failed round was logged and the queue closed, records lost)."""

import pytest

from daskqueue import defaults
from daskqueue.errors import QueueCallTimeoutError, QueueHandedOffError
from daskqueue.queue import resize

pytestmark = pytest.mark.timeout(20)


class Table:
    """The table calls forward_records makes (a scripted queue 0 whose destinations fail
    ``failures`` times first)."""

    def __init__(self, failures: int) -> None:
        self.lost: set[int] = set()
        self.removed: set[int] = set()
        self.failures = failures
        self.asked: list[int] = []

    def ask(self, q: int, method: str, dest: int, deadline: float | None = None) -> int:
        self.asked.append(dest)
        if self.failures:
            self.failures -= 1
            raise QueueHandedOffError(dest, "tcp://10.0.0.1:1")
        return 3

    def check_scheduler(self) -> None:
        pass


class Pool:
    def __init__(self, table: Table) -> None:
        self.table = table


def test_records_go_once_a_destination_takes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(defaults, "MOVE_POLL_S", 0.01)
    table = Table(failures=3)  # both destinations moving in the first round, one in the second
    assert resize.forward_records(Pool(table), 0, [1, 2]) == 3
    assert table.asked == [1, 2, 1, 2]


def test_no_destination_taking_them_stops_the_removal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(defaults, "MOVE_POLL_S", 0.01)
    monkeypatch.setattr(defaults, "MOVE_WAIT_S", 0.2)
    with pytest.raises(QueueCallTimeoutError):
        resize.forward_records(Pool(Table(failures=10**9)), 0, [1, 2])
