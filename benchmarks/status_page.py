"""status_page: a screenshot of the daskqueue status page, taken by headless Chromium.

Starts a LocalCluster with two pools: ``busy`` (consumers running short sleeps, a few tasks
that fail and are dead-lettered) and ``backlog`` (messages queued, no consumers); installs the
page (``daskqueue.status.install``), waits ``--settle`` seconds and runs
``chromium --headless --screenshot``; prints the PNG's path. Not a measurement: a look at the
page as a user sees it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common, tasks
from benchmarks.common import local_cluster, log


def boom(x: int) -> None:
    """A task that always fails (dead-lettered at once: the pool has ``max_retries=0``)."""
    raise ValueError(f"boom {x}")


def screenshot(chromium: str, url: str, path: Path, window: str) -> None:
    """``chromium --headless --screenshot`` of ``url`` into ``path`` (raises if none was written)."""
    path.unlink(missing_ok=True)
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--screenshot={path}", f"--window-size={window}", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if not path.is_file():
        raise RuntimeError(f"chromium wrote no screenshot (exit {done.returncode}): {done.stderr[-2000:]}")


def main() -> None:
    from daskqueue import ConsumerPool, QueuePool, status

    p = common.parser("status_page", __doc__)
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "daskqueue-status-page.png"),
                   help="where to write the PNG")
    p.add_argument("--tasks", type=common.positive, default=2000, help="sleep tasks in the busy pool")
    p.add_argument("--backlog", type=common.positive, default=5000, help="messages queued in the backlog pool")
    p.add_argument("--settle", type=float, default=1.5, help="seconds the consumers run before the shot")
    p.add_argument("--window-size", default="1200,800", help="the browser window, width,height")
    args = p.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium on PATH: apt-get install -y chromium")
    with local_cluster(args.workers, args.threads) as client:
        busy = QueuePool(client, n_queues=args.workers, name="busy", max_retries=0)
        backlog = QueuePool(client, n_queues=args.workers, name="backlog")
        consumers = ConsumerPool(client, busy)
        try:
            consumers.start()
            busy.batch_submit([(boom, i) for i in range(20)] + [(tasks.sleep_for, 0.01)] * args.tasks)
            backlog.batch_submit([(tasks.noop, i) for i in range(args.backlog)])
            url = status.install(client)
            log(f"status page at {url}; consumers run for {args.settle:g} s")
            time.sleep(args.settle)
            screenshot(chromium, url, Path(args.out), args.window_size)
        finally:
            consumers.close()
            busy.close()
            backlog.close()
    print(args.out)


if __name__ == "__main__":
    main()
