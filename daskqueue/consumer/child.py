"""The child process that runs a consumer's batches (``python -c "from daskqueue.consumer.child import main; main()"``).

Started by :class:`daskqueue.consumer.isolate.ProcessRunner`. It builds a twin of the
consumer (same class, same arguments, no queues) and runs the batches its parent sends on
its own threads (one per run slot of the consumer, and one more: see :class:`_Child`), so that user code that kills its process (``os._exit``, a
segfault in a C extension, the kernel's OOM killer) kills this process, not the worker and
the queue that lives there.

Wire format, both ways: frames of an 8-byte little-endian length and one pickle.

* parent -> child: ``("init", cloudpickled (cls, args, kwargs))`` first; then
  ``("run", request_id, batch (as batch_to_child makes it), funcs, drop, report_starts, skip,
  start_by)``, ``("halt",
  flag)`` and ``("take-back",)``: ``funcs`` are the functions (digest -> pickle) the batch
  needs that the child lacks, ``drop`` the digests the child forgets first (its parent bounds
  the table, ``isolate.ChildFunctions``), ``start_by`` the latest start allowed (epoch s) or
  None; ``take-back`` sends back every batch still waiting for a run thread.
* child -> parent: ``("ready",)`` or ``("init-failed", error)``; ``("started", request_id,
  position)`` before each item when ``report_starts``; ``("done", request_id, done, errors,
  fatal, results_blob, run_s)``, or ``("unrun", request_id, late)`` for a batch that never
  started (taken back, or with ``late`` past its ``start_by``).

The parent sends a batch as soon as it has fetched it, ahead of a free run thread: the
child's :class:`~daskqueue.consumer.start_gate.StartGate` starts it when a run thread frees
(on that thread, with no round trip to the parent), unless it was taken back or is late.

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
import time
from typing import Any, BinaryIO

from daskqueue.consumer.batch import batch_from_parent, dump_results
from daskqueue.consumer.start_gate import Arrival, StartGate, Waiting
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
    """The child's state: the consumer twin, its run threads, the locked output pipe.

    Leader and followers: the run threads take turns reading the input pipe (one at a
    time, under ``read_lock``); the one that reads a batch lets go of the pipe and runs the
    batch itself, and a waiting thread becomes the reader. A batch so starts on the thread
    that read it, with no hand-over to another thread (a wake-up of a sleeping thread, on
    the path of every task). A batch read while every slot of its kind runs waits at the
    gate; the thread whose batch ends next runs it. There is one thread more than slots
    (general and reserved): a thread is always left to read ``halt`` and ``take-back``
    while every slot runs.
    """

    def __init__(self, out: BinaryIO, stdin: BinaryIO, consumer: Any) -> None:
        self.out = out
        self.stdin = stdin
        self.consumer = consumer
        self.funcs: dict[bytes, bytes] = {}  # digest -> pickle: exactly what the parent sent and did not drop
        self.write_lock = threading.Lock()
        self.read_lock = threading.Lock()
        reserved = getattr(consumer, "reserved_slots", 0)
        self.threads = consumer.max_concurrency + reserved + 1
        self.gate = StartGate(consumer.max_concurrency, reserved)
        self.gate_lock = threading.Lock()
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

    def serve(self) -> None:
        """One run thread: read when it is this thread's turn, run what it read, then each
        batch the gate hands it as its slot frees."""
        while True:
            with self.read_lock:
                request: Waiting | None = self.next_run()
            while request is not None:
                try:
                    self.run(*request.item)
                except Exception:  # its reply could not be written: the parent is gone (end of input follows)
                    pass
                with self.gate_lock:
                    request, late = self.gate.finished(request.reserved, time.time())
                self.send_back(late, late=True)

    def send_back(self, batches: list[Waiting], *, late: bool) -> None:
        """Tell the parent these batches never started (it gives them back to their queue)."""
        for batch in batches:
            self.send(("unrun", batch.key, late))

    def next_run(self) -> Waiting:
        """Read frames until a batch to run now (``halt`` and ``take-back`` frames take
        effect at once, a batch for a busy slot waits at the gate); at end of input, end
        the process. Called under ``read_lock``: frames are applied in pipe order, the
        function table with them (see ``isolate.ChildFunctions``)."""
        while True:
            msg = read_frame(self.stdin)
            if msg is None:
                self.consumer.close_task_pools()  # its Client to the scheduler, if get_pool() opened one
                os._exit(0)  # the parent is gone: nobody will read what running items would give
            if msg[0] == "halt":
                self.consumer._halt_items = msg[1]
            elif msg[0] == "take-back":
                with self.gate_lock:
                    taken = self.gate.take_back()
                self.send_back(taken, late=False)
            elif msg[0] == "run":
                _, request_id, frame, funcs, drop, report_starts, skip, start_by = msg
                batch = batch_from_parent(frame)
                for digest in drop:
                    self.funcs.pop(digest, None)
                self.funcs.update(funcs)
                # Taken now, in pipe order: a later message may drop them while this batch runs.
                named = {s.digest for s in batch.segments if s.digest is not None}
                batch.funcs = {d: self.funcs[d] for d in named if d in self.funcs}
                request = Waiting(request_id, (request_id, batch, report_starts, skip),
                                  reserved=bool(getattr(batch, "reserved", False)), start_by=start_by)
                with self.gate_lock:
                    arrival = self.gate.arrive(request, time.time())
                if arrival is Arrival.START:
                    return request
                if arrival is Arrival.REFUSE:
                    self.send_back([request], late=True)

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
    child = _Child(out, stdin, consumer)
    child.send(("ready",))
    for k in range(1, child.threads):
        threading.Thread(target=child.serve, name=f"daskqueue-child-{k}", daemon=True).start()
    child.serve()  # this thread is one of them; the process ends at end of input (os._exit)


if __name__ == "__main__":
    main()
