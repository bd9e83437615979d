"""An attached producer in its own process whose messages the owner moves
(``tests/test_attach_moved.py``): ``python -m tests.attach_moved_client SCHEDULER NAME GATE``
attaches to pool NAME, maps keyed tasks over it that are slow until the path GATE exists (the
test creates it once it moved the messages), and prints what it got as JSON."""

from __future__ import annotations

import functools
import json
import sys

from distributed import Client

from daskqueue import QueuePool
from tests import backlog_tasks


def key_of(x: int) -> str:
    return f"key-{x % 30}"


def main(address: str, name: str, gate: str) -> None:
    with Client(address) as client:
        qp = QueuePool.attach(client, name)
        slow = functools.partial(backlog_tasks.sleep_until_opened, seconds=0.01, gate=gate)
        values = qp.map(slow, range(300), key=key_of, timeout_s=90)
        print(json.dumps({"map": values, "results": len(qp.results()), "failures": len(qp.failures())}))
        qp.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
