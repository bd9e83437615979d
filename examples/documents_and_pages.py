"""Documents made of a varying number of pages, written the natural way: one task per
document, which opens the document, finds how many pages it has, and enqueues one task per
page from inside itself (``daskqueue.get_pool()``). The client that submitted the documents
reads every outcome: the documents' (their pages' ids) and the pages'.

    python examples/documents_and_pages.py
"""

from __future__ import annotations

import random
import time

from distributed import Client

import daskqueue
from daskqueue import ConsumerPool, QueuePool, RemoteTaskError


def render_page(doc: str, page: int) -> str:
    time.sleep(0.001)  # stand-in for rendering / OCR
    return f"{doc}:{page}"


def open_document(doc: str, seed: int) -> list[int]:
    """Open a document, count its pages, enqueue one task per page; return their ids."""
    n_pages = random.Random(seed).randint(1, 40)  # known only once the document is open
    pool = daskqueue.get_pool()  # the pool this task came from
    return pool.batch_submit([(render_page, doc, page) for page in range(n_pages)])


def main(client: Client | None = None, n_docs: int = 100) -> dict[str, int]:
    own_client = client is None
    if own_client:
        client = Client(n_workers=2, threads_per_worker=1, dashboard_address=None)
    queue_pool = QueuePool(client, n_queues=2)
    consumer_pool = ConsumerPool(client, queue_pool)
    consumer_pool.start()
    try:
        started = time.perf_counter()
        docs = queue_pool.batch_submit([(open_document, f"doc{d}", d) for d in range(n_docs)])
        pages, failed = {}, 0
        # Every outcome until the pool is idle: the documents' and the pages they enqueued.
        for task_id, outcome in consumer_pool.as_completed(timeout=600):
            if isinstance(outcome, RemoteTaskError):
                failed += 1
            elif isinstance(outcome, str):
                pages[task_id] = outcome
        per_doc = {}
        for text in pages.values():
            doc = text.split(":")[0]
            per_doc[doc] = per_doc.get(doc, 0) + 1
        elapsed = time.perf_counter() - started
        print(f"{len(docs)} documents, {len(pages):,} pages in {elapsed:.2f} s; {failed} failed")
        return per_doc
    finally:
        consumer_pool.close()
        queue_pool.close()
        if own_client:
            client.close()


if __name__ == "__main__":
    main()
