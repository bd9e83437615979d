"""Pages of documents with varying processing times: most take ~1 ms, a few take 200 ms.

Adaptive batching keeps the short pages amortised (big batches) without hoarding the slow
ones. Compare the makespan with the ideal (total work / threads).

    python examples/document_pages.py
"""

import random
import time

from distributed import Client

from daskqueue import ConsumerPool, QueuePool


def process_page(doc, page, seconds, dpi=150):
    time.sleep(seconds)  # stand-in for rendering / OCR
    return f"{doc}:{page}@{dpi}"


def main(n_docs=200, pages_per_doc=50, seed=1):
    rng = random.Random(seed)
    work = []
    for doc in range(n_docs):
        for page in range(pages_per_doc):
            seconds = 0.2 if rng.random() < 0.001 else rng.lognormvariate(-7.2, 0.6)
            work.append((process_page, f"doc{doc}", page, seconds))

    client = Client(n_workers=2, threads_per_worker=1, dashboard_address=None)
    queue_pool = QueuePool(client, n_queues=2)
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=2)
    consumer_pool.start()

    started = time.perf_counter()
    ids = queue_pool.batch_submit(work)
    cover = queue_pool.submit(process_page, "doc0", 0, 0.0, dpi=300)  # keyword arguments too
    consumer_pool.join(timeout=600)
    makespan = time.perf_counter() - started

    results = consumer_pool.results()
    ideal = sum(w[3] for w in work) / 2
    print(f"{len(ids):,} pages in {makespan:.2f} s; ideal {ideal:.2f} s ({makespan / ideal:.2f}x)")
    print("cover page:", results[cover])

    consumer_pool.close()
    queue_pool.close()
    client.close()


if __name__ == "__main__":
    main()
