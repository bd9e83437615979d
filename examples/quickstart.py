"""Quickstart: a million small tasks through daskqueue on a local cluster.

    python examples/quickstart.py
"""

from distributed import Client

from daskqueue import ConsumerPool, QueuePool


def square(x):
    return x * x


def main():
    client = Client(n_workers=2, threads_per_worker=1, dashboard_address=None)
    queue_pool = QueuePool(client, n_queues=2)
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=2)
    consumer_pool.start()

    # map: results in input order, with a progress bar.
    squares = queue_pool.map(square, range(1_000_000), progress=True)
    print("sum of squares:", sum(squares))

    # submit / batch_submit: ids now, results when you join.
    one = queue_pool.submit(square, 12)
    many = queue_pool.batch_submit([(square, i) for i in range(10)])
    consumer_pool.join(timeout=60)
    results = consumer_pool.results()
    print("12 squared:", results[one], "| first ten:", [results[i] for i in many])

    consumer_pool.close()
    queue_pool.close()
    client.close()


if __name__ == "__main__":
    main()
