"""Task functions of the nested-submission and attach tests (importable on the workers)."""

from __future__ import annotations

import os
import time

import daskqueue


def page(doc: int, number: int) -> tuple[int, int]:
    """A page's work: here, its coordinates."""
    return doc, number


def document(doc: int, n_pages: int) -> list[int]:
    """A document: one task per page, enqueued from inside this task; returns their ids."""
    pool = daskqueue.get_pool()
    return pool.batch_submit([(page, doc, p) for p in range(n_pages)])


def shelf(first_doc: int, n_docs: int, n_pages: int) -> list[int]:
    """Two levels: a task per document, each enqueueing its pages."""
    pool = daskqueue.get_pool()
    return [pool.submit(document, first_doc + d, n_pages) for d in range(n_docs)]


def document_via(pool, doc: int, n_pages: int) -> list[int]:
    """A document task given its pool as an argument."""
    return pool.batch_submit([(page, doc, p) for p in range(n_pages)])


def squares_inside(n: int) -> list[int]:
    """A task that maps over the pool it runs in and waits for the results."""
    return daskqueue.get_pool().map(square, range(n), timeout_s=30)


def squares_streamed_inside(n: int) -> list[int]:
    """A task that streams over the pool it runs in (imap) and collects the results."""
    return list(daskqueue.get_pool().imap(square, iter(range(n)), window=4, timeout_s=30))


def executor_inside() -> str:
    """A task that asks for an executor on the pool it runs in (refused: a ConfigurationError)."""
    try:
        daskqueue.get_pool().executor()
    except daskqueue.ConfigurationError as e:
        return f"refused: {e}"
    return "accepted"


def square(x: int) -> int:
    return x * x


def slow_document(doc: int, n_pages: int, seconds: float) -> list[int]:
    """A document that enqueues its pages one at a time, slowly (a worker is killed meanwhile)."""
    pool = daskqueue.get_pool()
    ids = []
    for p in range(n_pages):
        ids.append(pool.submit(page, doc, p))
        time.sleep(seconds)
    return ids


def pid_page(doc: int, number: int) -> tuple[int, int, int]:
    return doc, number, os.getpid()


def oversized_follow_up(n_bytes: int) -> int:
    """A task whose follow-up's argument is too big to be stored."""
    return daskqueue.get_pool().submit(page, b"x" * n_bytes, 0)


def submit_from_a_dask_task(pool, x: int) -> int:
    """A plain Dask task (client.submit) given a pool: it submits to the pool."""
    return pool.submit(square, x)


class Splitter(daskqueue.ConsumerBase):
    """A custom consumer: a number becomes two words, enqueued from process_item."""

    def process_item(self, message):
        if isinstance(message.data, str):
            return message.data.upper()
        return daskqueue.get_pool().put_many([f"w{message.data}-{i}" for i in range(2)])
