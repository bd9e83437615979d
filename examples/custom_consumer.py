"""A custom consumer: process raw items (here, copy files) with ``process_item``.

    python examples/custom_consumer.py
"""

import pathlib
import shutil
import tempfile

from distributed import Client

from daskqueue import ConsumerBase, ConsumerPool, QueuePool


class CopyFiles(ConsumerBase):
    """Each item is a ``(source, destination)`` pair of paths; the result is the bytes copied."""

    def setup(self):
        # Runs once per consumer, on the thread that processes the items.
        self.copied = 0

    def process_item(self, message):
        source, destination = message.data
        shutil.copyfile(source, destination)
        self.copied += 1
        return pathlib.Path(destination).stat().st_size


def main():
    src = pathlib.Path(tempfile.mkdtemp(prefix="daskqueue-src-"))
    dst = pathlib.Path(tempfile.mkdtemp(prefix="daskqueue-dst-"))
    for i in range(200):
        (src / f"file{i:03d}.txt").write_text("x" * i)

    client = Client(n_workers=2, threads_per_worker=1, dashboard_address=None)
    queue_pool = QueuePool(client, n_queues=2, max_retries=2)
    consumer_pool = ConsumerPool(client, queue_pool, CopyFiles, n_consumers=2, max_concurrency=4)
    consumer_pool.start()

    pairs = [(str(p), str(dst / p.name)) for p in sorted(src.iterdir())]
    pairs.append((str(src / "missing.txt"), str(dst / "missing.txt")))  # this one fails
    ids = queue_pool.put_many(pairs)
    consumer_pool.join(timeout=120)

    results, failures = consumer_pool.results(), consumer_pool.failures()
    print(f"copied {len(results)} files, {sum(results.values())} bytes")
    for task_id, error in failures.items():
        print(f"failed {task_id} after {error.attempts} attempts: {error.exc_type}: {error.exc_message}")
    assert set(results) | set(failures) == set(ids)

    consumer_pool.close()
    queue_pool.close()
    client.close()


if __name__ == "__main__":
    main()
