"""A second client of a running pool, in its own process (``tests/test_attach.py``):
``python -m tests.attach_client SCHEDULER NAME`` attaches to pool NAME, maps over it, and
prints what it got as JSON."""

from __future__ import annotations

import json
import sys

from distributed import Client

from daskqueue import QueuePool
from tests import tasks


def main(address: str, name: str) -> None:
    with Client(address) as client:
        qp = QueuePool.attach(client, name)
        mapped = []
        for k in range(4):
            mapped += qp.map(tasks.double, range(10_000 + 100 * k, 10_100 + 100 * k), timeout_s=60)
        ids = qp.batch_submit([(tasks.add, i, 1) for i in range(5)])
        one_by_one = [qp.result(i, timeout_s=30) for i in ids]
        print(json.dumps({"repr": repr(qp), "map": mapped, "result": one_by_one,
                          "results": sorted(qp.results().values()), "failures": len(qp.failures())}))
        qp.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
