"""Point 10 of issue 22: 0.2.0's ``daskqueue.utils.logger`` printed, in the script and in
its consumers on the workers, and so did ``join(progress=True)``; a script written for it
still sees its lines."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import time
    from distributed import Client
    from daskqueue import QueuePool, ConsumerPool, ConsumerBaseClass
    from daskqueue.utils import logger

    def slow():  # two of them keep join() waiting 1.5 s: 3 of its 0.5 s progress steps
        time.sleep(0.75)

    class Printer(ConsumerBaseClass):
        def process_item(self, item):
            logger.info("worker got %s", item)

    if __name__ == "__main__":
        logger.info("a line of the script")
        client = Client(n_workers=1, threads_per_worker=1, dashboard_address=None)
        queue_pool = QueuePool(client, 1)
        consumer_pool = ConsumerPool(client, queue_pool, n_consumers=1)
        consumer_pool.start()
        queue_pool.submit(slow)
        queue_pool.submit(slow)
        consumer_pool.join(timestep=0.1, print_timestep=0.5, progress=True)
        consumer_pool.close()
        printer = ConsumerPool(client, queue_pool, Printer, 1)
        printer.start()
        queue_pool.put_many(["item-xyz"])
        printer.join()
        printer.close()
        queue_pool.close()
        client.close()
""")


@pytest.mark.timeout(180)
def test_the_old_logger_and_join_progress_print(tmp_path):
    path = tmp_path / "old_script.py"
    path.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "INFO: a line of the script" in done.stderr
    assert "still processing" in done.stderr  # join(progress=True)'s counts
    assert "INFO: worker got item-xyz" in done.stderr  # printed by the worker, as in 0.2.0


QUIET = textwrap.dedent("""
    import logging
    import daskqueue
    logging.getLogger("daskqueue").info("not printed")
    logging.getLogger("daskqueue").warning("not printed either")
    print("OK")
""")


@pytest.mark.timeout(60)
def test_todays_package_configures_no_logging():
    done = subprocess.run([sys.executable, "-c", QUIET], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0 and "OK" in done.stdout and "printed" not in done.stderr, done.stderr
