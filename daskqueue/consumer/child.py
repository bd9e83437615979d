"""The child process that runs a consumer's batches (``python -c "from daskqueue.consumer.child import main; main()"``).

Started by :class:`daskqueue.consumer.isolate.ProcessRunner`. It builds a twin of the
consumer (same class, same arguments, no queues) and runs the batches its parent sends on
``max_concurrency`` threads, so that user code that kills its process (``os._exit``, a
segfault in a C extension, the kernel's OOM killer) kills this process, not the worker and
the queue that lives there.

Wire format, both ways: frames of an 8-byte little-endian length and one pickle.

* parent -> child: ``("init", cloudpickled (cls, args, kwargs))`` first; then
  ``("run", request_id, batch, funcs, drop, report_starts, skip)`` and ``("halt", flag)``:
  ``funcs`` are the functions (digest -> pickle) the batch needs that the child lacks, ``drop``
  the digests the child forgets first (its parent bounds the table, ``isolate.ChildFunctions``).
* child -> parent: ``("ready",)`` or ``("init-failed", error)``; ``("started", request_id,
  position)`` before each item when ``report_starts``; ``("done", request_id, done, errors,
  fatal, results_blob, run_s)``.

The child's stdout is the parent's pipe: file descriptor 1 is pointed at stderr first, so a
``print`` in user code cannot corrupt a frame. End of input (the parent closed the pipe or
died) ends the process at once.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from daskqueue.consumer.batch import dump_results
from daskqueue.messages import error_from_exception

FRAME = struct.Struct("<Q")


def read_frame(stream: BinaryIO) -> Any:
    """One frame's object, or ``None`` at end of input."""
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (size,) = FRAME.unpack(head)
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def encode_frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    return FRAME.pack(len(body)) + body


#: The GIL switch interval of a child process with reserved slots (Python's default: 5 ms).
URGENT_SWITCH_INTERVAL_S = 0.0005

#: How much lower the child's CPU priority is when it has reserved slots (``os.nice``).
URGENT_CHILD_NICE = 5


class _Child:
    """The child's state: the consumer twin, its thread pool, the locked output pipe."""

    def __init__(self, out: BinaryIO, consumer: Any) -> None:
        self.out = out
        self.consumer = consumer
        self.funcs: dict[bytes, bytes] = {}  # digest -> pickle: exactly what the parent sent and did not drop
        self.write_lock = threading.Lock()
        self.pool = ThreadPoolExecutor(consumer.max_concurrency, thread_name_prefix="daskqueue-child")
        # Reserved slots run urgent batches on threads of their own: a batch fetched ahead
        # waits for a general thread, never takes a reserved one.
        reserved = getattr(consumer, "reserved_slots", 0)
        self.reserved_pool = ThreadPoolExecutor(reserved, thread_name_prefix="daskqueue-child-reserved") if reserved else None
        if reserved:
            # A CPU-bound task holds the GIL for up to the switch interval (5 ms) each time
            # the urgent thread asks for it, and a short task asks several times: hand the
            # GIL over 10x sooner in this process, where urgent work shares it by design.
            sys.setswitchinterval(URGENT_SWITCH_INTERVAL_S)
            # And let the worker processes (the queues and consumers that carry an urgent
            # task to this child and its result back) run before this child's long tasks
            # when the cores are all busy: the long tasks lose a little CPU only then.
            try:
                os.nice(URGENT_CHILD_NICE)
            except OSError:  # not allowed here: the switch interval alone still helps
                pass

    def send(self, obj: Any) -> None:
        frame = encode_frame(obj)
        with self.write_lock:
            self.out.write(frame)
            self.out.flush()

    def run(self, request_id: int, batch: Any, report_starts: bool, skip: dict[int, bytes]) -> None:
        on_start = (lambda pos: self.send(("started", request_id, pos))) if report_starts else None
        try:
            outcome, run_s = self.consumer._run_batch_safely(batch, on_start=on_start, skip=skip)
            blob = dump_results(outcome)
        except BaseException as e:  # never leave the parent waiting: every item failed
            error = error_from_exception(e)
            done, blob, run_s = batch.count, pickle.dumps([None] * batch.count), 0.0
            self.send(("done", request_id, done, dict.fromkeys(range(done), error), set(), blob, run_s))
            return
        self.send(("done", request_id, outcome.done, outcome.errors, outcome.fatal, blob, run_s))


def main() -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # user prints go to stderr, never into a frame
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    init = read_frame(stdin)
    if init is None or init[0] != "init":
        out.close()
        return
    try:
        import cloudpickle  # noqa: F401  (the class may be pickled by value)

        cls, args, kwargs = pickle.loads(init[1])
        consumer = cls(*args, **kwargs)
    except BaseException as e:
        out.write(encode_frame(("init-failed", error_from_exception(e))))
        out.close()
        return
    child = _Child(out, consumer)
    child.send(("ready",))
    while True:
        msg = read_frame(stdin)
        if msg is None:
            consumer.close_task_pools()  # its Client to the scheduler, if get_pool() opened one
            os._exit(0)  # the parent is gone: nobody will read what running items would give
        if msg[0] == "halt":
            consumer._halt_items = msg[1]
        elif msg[0] == "run":
            _, request_id, batch, funcs, drop, report_starts, skip = msg
            for digest in drop:
                child.funcs.pop(digest, None)
            child.funcs.update(funcs)
            # Taken now, in pipe order: a later message may drop them while this batch waits.
            named = {s.digest for s in batch.segments if s.digest is not None}
            batch.funcs = {d: child.funcs[d] for d in named if d in child.funcs}
            pool = child.reserved_pool if getattr(batch, "reserved", False) and child.reserved_pool else child.pool
            pool.submit(child.run, request_id, batch, report_starts, skip)


if __name__ == "__main__":
    main()
