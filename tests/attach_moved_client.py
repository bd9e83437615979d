"""An attached producer in its own process whose messages the owner moves
(``tests/test_attach_moved.py``): ``python -m tests.attach_moved_client SCHEDULER NAME`` attaches
to pool NAME, maps slow keyed tasks over it, and prints what it got as JSON."""

from __future__ import annotations

import functools
import json
import sys

from distributed import Client

from daskqueue import QueuePool
from tests import tasks


def key_of(x: int) -> str:
    return f"key-{x % 30}"


def main(address: str, name: str) -> None:
    with Client(address) as client:
        qp = QueuePool.attach(client, name)
        values = qp.map(functools.partial(tasks.sleep_then, seconds=0.01), range(300), key=key_of, timeout_s=90)
        print(json.dumps({"map": values, "results": len(qp.results()), "failures": len(qp.failures())}))
        qp.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
