"""``QueuePool``: the client-side handle of a pool of queue actors.

The handle caches the queue actors' handles and sends batches straight to them, round-robin;
the pool actor (control plane) is asked once, at creation.
"""

from __future__ import annotations

import html
import itertools
import json
import logging
import os
import time
import uuid
from typing import Any, Callable, Iterable, Literal, Sequence

from distributed import Client

from daskqueue import defaults
from daskqueue.errors import (
    ConfigurationError,
    InvalidTaskError,
    JoinTimeoutError,
    QueueClosedError,
    QueueLostError,
)
from daskqueue.messages import MAX_QUEUES, QUEUE_INDEX_BITS, Kind, make_id
from daskqueue.queue.base import QueueStats
from daskqueue.queue.durable import DurableQueue
from daskqueue.queue.handles import LOST_CHECK_S, actor_lost, direct_handles, is_lost_worker
from daskqueue.queue.pool_actor import QueuePoolActor
from daskqueue.queue.transient import TransientQueue
from daskqueue.results import MapClaim, ResultCollector
from daskqueue.serialize import Group, PickledFunction, encode_put, pack_payloads, pickle_function

__all__ = ["QueuePool"]

logger = logging.getLogger("daskqueue")

Durability = Literal["transient", "durable"]


def _positive(name: str, value: Any, *, allow_zero: bool = False, integer: bool = False) -> None:
    kind_ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not kind_ok or value < 0 or (value == 0 and not allow_zero):
        need = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{name} must be {'an integer' if integer else 'a number'} {need}, got {value!r}")


POOL_FILE = "daskqueue-pool.json"


def _prepare_pool_dir(dirpath: str, n_queues: int) -> list[str]:
    """Create or check a pool directory; return the queue directories, in order."""
    meta = os.path.join(dirpath, POOL_FILE)
    if os.path.exists(dirpath) and not os.path.isdir(dirpath):
        raise ConfigurationError(f"dirpath {dirpath} exists and is not a directory")
    os.makedirs(dirpath, exist_ok=True)
    if os.path.exists(meta):
        with open(meta) as f:
            known = json.load(f)
        if known.get("format") != 1:
            raise ConfigurationError(f"{meta} has an unknown format {known.get('format')!r}")
        if n_queues < known["n_queues"]:
            raise ConfigurationError(
                f"{dirpath} holds {known['n_queues']} queues; reopen it with n_queues >= "
                f"{known['n_queues']} so that none of their messages is orphaned"
            )
    elif os.listdir(dirpath):
        from daskqueue.errors import ForeignDirectoryError

        raise ForeignDirectoryError(f"{dirpath} is not empty and is not a daskqueue pool directory")
    tmp = meta + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": 1, "n_queues": n_queues}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, meta)
    return [os.path.join(dirpath, f"queue-{i:03d}") for i in range(n_queues)]


def _results_or_raise(futures: list[Any]) -> list[Any]:
    """Results of all futures; if any failed, release the others and raise the first error."""
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.release()
        raise


class QueuePool:
    """A pool of ``n_queues`` queue actors on the cluster of ``client``.

    Messages are routed round-robin, one put batch at a time; a call's messages are spread
    evenly over the queues, at most ``put_batch_size`` per put.
    Every submission returns message ids; results and failures come back through
    ``ConsumerPool.results()`` / ``failures()`` (or as the return value of :meth:`map`).

    Parameters (all but ``client`` and ``n_queues`` keyword-only):

    * ``durability``: ``"transient"`` (in worker memory, lost with the worker) or
      ``"durable"`` (on disk under ``dirpath``, one directory per queue; a new pool on the
      same ``dirpath``, in this or a new cluster, recovers every queue). The workers must see
      ``dirpath`` (a shared file system, or the same host).
    * ``fsync`` (durable): ``"always"``, ``"interval"`` (every ``fsync_interval_s``, default
      0.1 s) or ``"never"``; see ``daskqueue/segment/FORMAT.md`` for what each loses.
    * ``max_segment_bytes`` (durable, default 64 MiB): log segment size; also caps one message.
    * ``compact_index_bytes`` (durable, default 16 MiB): index size that triggers compaction.
    * ``lease_timeout_s`` (default 30): how long a delivered message may stay unsettled
      before it is redelivered; consumers extend the leases of work they are running.
    * ``max_retries`` (default 3): failed runs retried before a message is dead-lettered.
    * ``retry_backoff_base_s`` / ``retry_backoff_max_s``: exponential backoff between retries.
    * ``max_message_bytes`` (default 64 MiB): largest pickled task or item.
    * ``put_batch_size`` (default 20,000): messages per ``put_batch`` call.
    * ``direct_to_workers``: ``None`` (default) calls the queue actors' workers directly
      when the client can reach them (checked once, here) and through the scheduler
      otherwise; ``True`` / ``False`` force one or the other. Defaults to the client's own
      ``direct_to_workers`` setting when that is set.

    Thread safety: use one ``QueuePool`` from one thread at a time.
    """

    def __init__(
        self,
        client: Client,
        n_queues: int = 1,
        *,
        durability: Durability = "transient",
        lease_timeout_s: float = defaults.LEASE_TIMEOUT_S,
        max_retries: int = defaults.MAX_RETRIES,
        retry_backoff_base_s: float = defaults.RETRY_BACKOFF_BASE_S,
        retry_backoff_max_s: float = defaults.RETRY_BACKOFF_MAX_S,
        max_message_bytes: int = defaults.MAX_MESSAGE_BYTES,
        put_batch_size: int = defaults.PUT_BATCH_MESSAGES,
        dirpath: str | os.PathLike[str] | None = None,
        fsync: Literal["always", "interval", "never"] = "interval",
        fsync_interval_s: float = defaults.FSYNC_INTERVAL_S,
        max_segment_bytes: int = defaults.MAX_SEGMENT_BYTES,
        compact_index_bytes: int = defaults.COMPACT_INDEX_BYTES,
        name: str | None = None,
        direct_to_workers: bool | None = None,
    ) -> None:
        if not isinstance(client, Client):
            raise ConfigurationError(f"client must be a distributed.Client, got {type(client).__name__}")
        _positive("n_queues", n_queues, integer=True)
        if n_queues > MAX_QUEUES:
            raise ConfigurationError(f"n_queues must be <= {MAX_QUEUES}, got {n_queues}")
        if durability not in ("transient", "durable"):
            raise ConfigurationError(f"durability must be 'transient' or 'durable', got {durability!r}")
        if durability == "durable" and dirpath is None:
            raise ConfigurationError("durability='durable' needs dirpath= (a directory the workers can see)")
        if durability == "transient" and dirpath is not None:
            raise ConfigurationError("dirpath= is only for durability='durable'")
        if fsync not in ("always", "interval", "never"):
            raise ConfigurationError(f"fsync must be 'always', 'interval' or 'never', got {fsync!r}")
        _positive("fsync_interval_s", fsync_interval_s)
        _positive("max_segment_bytes", max_segment_bytes, integer=True)
        if max_segment_bytes < 65536:
            raise ConfigurationError(f"max_segment_bytes must be >= 65536, got {max_segment_bytes}")
        _positive("compact_index_bytes", compact_index_bytes, integer=True)
        _positive("lease_timeout_s", lease_timeout_s)
        _positive("max_retries", max_retries, allow_zero=True, integer=True)
        _positive("retry_backoff_base_s", retry_backoff_base_s, allow_zero=True)
        _positive("retry_backoff_max_s", retry_backoff_max_s, allow_zero=True)
        _positive("max_message_bytes", max_message_bytes, integer=True)
        _positive("put_batch_size", put_batch_size, integer=True)
        self.client = client
        self.n_queues = n_queues
        self.durability = durability
        self.name = name or f"queuepool-{uuid.uuid4().hex[:8]}"
        self.lease_timeout_s = float(lease_timeout_s)
        if durability == "durable":
            # One message must fit in one log segment (with its record and chunk headers).
            max_message_bytes = min(max_message_bytes, max_segment_bytes - 8192)
        self.max_message_bytes = max_message_bytes
        self.put_batch_size = put_batch_size
        self.dirpath = None if dirpath is None else os.path.abspath(os.fspath(dirpath))
        config = dict(
            lease_timeout_s=lease_timeout_s,
            max_retries=max_retries,
            retry_backoff_base_s=retry_backoff_base_s,
            retry_backoff_max_s=retry_backoff_max_s,
            max_message_bytes=max_message_bytes,
        )
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        if not workers:
            raise ConfigurationError("the client's cluster has no workers")
        self._pool_future = client.submit(QueuePoolActor, self.name, config, actor=True, pure=False)
        queue_class: type = TransientQueue
        queue_args: list[tuple[Any, ...]] = [(i,) for i in range(n_queues)]
        if durability == "durable":
            queue_class = DurableQueue
            dirs = _prepare_pool_dir(self.dirpath, n_queues)  # type: ignore[arg-type]
            queue_args = [(i, d) for i, d in enumerate(dirs)]
            config.update(
                fsync=fsync, fsync_interval_s=fsync_interval_s,
                max_segment_bytes=max_segment_bytes, compact_index_bytes=compact_index_bytes,
            )
        self._queue_futures = [
            client.submit(
                queue_class, *args, **config, actor=True, pure=False,
                workers=[workers[i % len(workers)]], allow_other_workers=True,
            )
            for i, args in enumerate(queue_args)
        ]
        self._actor = self._pool_future.result()
        self.queues = _results_or_raise(self._queue_futures)
        self._actor.register(self.queues).result()
        if direct_to_workers is None:
            direct_to_workers = client.direct_to_workers
        self.queues = direct_handles(self.queues, direct=direct_to_workers)
        self._rr = itertools.count()
        self._sent_funcs: list[set[bytes]] = [set() for _ in range(n_queues)]
        self._collector = ResultCollector(n_queues, self._call, self._answer)
        self._closed = False
        self.submitted = 0
        logger.info("%r started", self)

    # -- representation -----------------------------------------------------------------------

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<QueuePool {self.name!r}: {self.n_queues} {self.durability} queues, {state}>"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{s.index}</td><td>{s.ready:,}</td><td>{s.delayed:,}</td><td>{s.leased:,}</td>"
            f"<td>{s.total_acked:,}</td><td>{s.dead:,}</td></tr>"
            for s in (self.stats() if not self._closed else [])
        )
        return (
            f"<div><strong>QueuePool</strong> {html.escape(self.name)}: {self.n_queues} "
            f"{self.durability} queues{' (closed)' if self._closed else ''}"
            "<table><tr><th>queue</th><th>ready</th><th>delayed</th><th>leased</th>"
            f"<th>acked</th><th>dead</th></tr>{rows}</table></div>"
        )

    # -- submitting tasks ---------------------------------------------------------------------

    def submit(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        """Enqueue ``func(*args, **kwargs)``; return its task id."""
        return self._submit_calls([(func, args, kwargs)])[0]

    def batch_submit(
        self,
        tasks: Iterable[Sequence[Any]],
        *,
        type: str | None = None,
        priority: int = 0,
        key: str | None = None,
        delay_s: float = 0.0,
    ) -> list[int]:
        """Enqueue tasks given as tuples ``(func, *args)``; return their ids, in order.

        Every task is validated and pickled before anything is sent: an unpicklable or
        non-callable task raises (naming its index) and enqueues nothing. Each distinct
        function is pickled once per call.
        """
        self._check_open()
        self._check_options(priority, delay_s, type, key)
        tasks = tasks if isinstance(tasks, list) else list(tasks)
        fast = self._encode_uniform(tasks, type, priority, key, float(delay_s))
        if fast is not None:
            return self._send(fast, n=len(tasks))
        calls = []
        for i, task in enumerate(tasks):
            if not isinstance(task, (tuple, list)) or not task:
                raise InvalidTaskError(f"task {i} must be a tuple (func, *args), got {task!r:.80}")
            calls.append((task[0], tuple(task[1:]), None))
        return self._submit_calls(calls, type=type, priority=priority, key=key, delay_s=delay_s)

    def _encode_uniform(self, tasks, type, priority, key, delay_s):  # type: ignore[no-untyped-def]
        """The fast path of ``batch_submit``: every task calls one function. Returns None when
        the tasks are anything else (the general path then validates them one by one)."""
        try:
            funcs = {t[0] for t in tasks}
        except Exception:  # not subscriptable, empty, or an unhashable "function"
            return None
        if len(funcs) != 1:
            return None
        (func,) = funcs
        if not callable(func) or not all(isinstance(t, (tuple, list)) for t in tasks[:1]):
            return None
        pickled = pickle_function(func)
        blobs = []
        size = self._chunk_size(len(tasks))
        for lo in range(0, len(tasks), size):
            chunk = tasks[lo : lo + size]
            payloads = [t[1:] for t in chunk]
            positions = range(lo, lo + len(chunk))
            offsets, data = self._pack(payloads, positions, single=False)
            group = Group(Kind.CALL, pickled.digest, type, priority, key, delay_s, len(chunk), offsets, data)
            blobs.append(([group], {pickled.digest: pickled.data}, [positions]))
        return blobs

    def map(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Any],
        *,
        progress: bool = False,
        timeout_s: float | None = None,
        errors: Literal["raise", "return"] = "raise",
        priority: int = 0,
        type: str | None = None,
    ) -> list[Any]:
        """Run ``func(x)`` for each ``x`` on the cluster; return the results in input order.

        Needs a started ``ConsumerPool`` on this pool. ``progress=True`` shows a tqdm bar with
        done / failed / rate. A task that fails on its last retry: with ``errors="raise"`` the
        first such :class:`RemoteTaskError` (by input position) is raised once every task is
        settled; with ``errors="return"`` it takes the task's place in the list. Raises
        :class:`JoinTimeoutError` after ``timeout_s``.
        """
        if errors not in ("raise", "return"):
            raise ConfigurationError(f"errors must be 'raise' or 'return', got {errors!r}")
        self._check_open()
        self._check_options(priority, 0.0, type)
        started = time.monotonic()
        items = list(iterable)
        pickled = pickle_function(func)
        claim = MapClaim(len(items))
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=claim.n, unit="task", desc="daskqueue")
        blobs = []
        size = self._chunk_size(len(items))
        for lo in range(0, len(items), size):
            chunk = items[lo : lo + size]
            offsets, data = pack_payloads(
                [(x,) for x in chunk], max_message_bytes=self.max_message_bytes, first_index=lo
            )
            group = Group(Kind.CALL, pickled.digest, type, priority, None, 0.0, len(chunk), offsets, data)
            blobs.append(([group], {pickled.digest: pickled.data}, [range(lo, lo + len(chunk))]))
        try:
            self._send(blobs, claim=claim)
            deadline = None if timeout_s is None else started + timeout_s
            return self._wait_map(
                claim, bar=bar, deadline=deadline, timeout_s=timeout_s, errors=errors
            )
        finally:
            self._collector.release(claim)
            if bar is not None:
                bar.close()

    def _wait_map(
        self,
        claim: MapClaim,
        *,
        bar: Any,
        deadline: float | None,
        timeout_s: float | None,
        errors: str,
    ) -> list[Any]:
        shown = 0
        while not claim.complete:
            arrived = self._collector.poll()
            # Checked on every pass, not only when nothing arrived: a long map that keeps
            # completing tasks must still time out.
            if not claim.complete and deadline is not None and time.monotonic() > deadline:
                counts = {
                    "done": claim.settled - len(claim.failures),
                    "failed": len(claim.failures),
                    "pending": claim.n - claim.settled,
                }
                raise JoinTimeoutError(timeout_s or 0.0, counts)
            if arrived == 0:
                time.sleep(defaults.POLL_INTERVAL_S)
            if bar is not None and claim.settled > shown:
                bar.update(claim.settled - shown)
                bar.set_postfix(failed=len(claim.failures), refresh=False)
                shown = claim.settled
        if claim.failures:
            if errors == "raise":
                raise claim.failures[min(claim.failures)]
            for position, error in claim.failures.items():
                claim.values[position] = error
        return claim.values

    # -- raw items ----------------------------------------------------------------------------

    def put(self, item: Any, *, type: str | None = None, priority: int = 0, key: str | None = None,
            delay_s: float = 0.0) -> int:
        """Enqueue one raw item for a custom consumer; return its message id."""
        return self.put_many([item], type=type, priority=priority, key=key, delay_s=delay_s)[0]

    def put_many(self, items: Iterable[Any], *, type: str | None = None, priority: int = 0,
                 key: str | None = None, delay_s: float = 0.0) -> list[int]:
        """Enqueue raw items (each pickled on its own) for a custom consumer; return their ids."""
        self._check_open()
        self._check_options(priority, delay_s, type, key)
        items = list(items)
        blobs = []
        size = self._chunk_size(len(items))
        for lo in range(0, len(items), size):
            chunk = items[lo : lo + size]
            offsets, data = pack_payloads(
                chunk, max_message_bytes=self.max_message_bytes, what="item", first_index=lo
            )
            group = Group(Kind.RAW, None, type, priority, key, float(delay_s), len(chunk), offsets, data)
            blobs.append(([group], {}, [range(lo, lo + len(chunk))]))
        return self._send(blobs, n=len(items))

    # -- encoding and sending -----------------------------------------------------------------

    def _submit_calls(
        self,
        calls: list[tuple[Any, tuple[Any, ...], dict[str, Any] | None]],
        *,
        type: str | None = None,
        priority: int = 0,
        key: str | None = None,
        delay_s: float = 0.0,
    ) -> list[int]:
        self._check_open()
        self._check_options(priority, delay_s, type, key)
        blobs = []
        functions: dict[Any, PickledFunction] = {}
        size = self._chunk_size(len(calls))
        for lo in range(0, len(calls), size):
            blobs.append(self._encode_calls(calls, lo, size, functions, type, priority, key, float(delay_s)))
        return self._send(blobs, n=len(calls))

    def _chunk_size(self, n: int) -> int:
        """Messages per put: spread a call over every queue, at most ``put_batch_size`` each."""
        return max(1, min(self.put_batch_size, -(-n // self.n_queues)))

    def _encode_calls(self, calls, lo, size, functions, type, priority, key, delay_s):  # type: ignore[no-untyped-def]
        """One put blob's groups for ``calls[lo : lo + size]``, one group per kind and
        function; also returns the input positions of each group's messages."""
        by_group: dict[tuple[int, bytes], tuple[list[int], list[Any]]] = {}
        funcs: dict[bytes, bytes] = {}
        for i in range(lo, min(lo + size, len(calls))):
            func, args, kwargs = calls[i]
            fkey: Any = func if getattr(func, "__hash__", None) else id(func)
            pickled = functions.get(fkey)
            if pickled is None:
                pickled = functions[fkey] = pickle_function(func, index=i if len(calls) > 1 else None)
            funcs[pickled.digest] = pickled.data
            kind = Kind.CALL_KW if kwargs else Kind.CALL
            positions, payloads = by_group.setdefault((kind, pickled.digest), ([], []))
            positions.append(i)
            payloads.append((args, kwargs) if kwargs else args)
        groups, positions_per_group = [], []
        for (kind, digest), (positions, payloads) in by_group.items():
            offsets, data = self._pack(payloads, positions, single=len(calls) == 1)
            groups.append(Group(kind, digest, type, priority, key, delay_s, len(positions), offsets, data))
            positions_per_group.append(positions)
        return groups, funcs, positions_per_group

    def _pack(self, payloads: list[Any], positions: list[int], *, single: bool) -> tuple[bytes, bytes]:
        from daskqueue.errors import PayloadTooLargeError, SerializationError

        try:
            return pack_payloads(payloads, max_message_bytes=self.max_message_bytes)
        except SerializationError as e:
            index = None if single or e.index is None else positions[e.index]
            where = "" if index is None else f" of task {index}"
            raise SerializationError(f"cannot pickle the arguments{where}: {e.__cause__}", index=index) from e.__cause__
        except PayloadTooLargeError as e:
            index = None if single or e.index is None else positions[e.index]
            raise PayloadTooLargeError(e.size, e.limit, index=index) from None

    def _send(self, blobs: list[tuple[list[Group], dict[bytes, bytes], list[list[int]]]], *,
              n: int = 0, claim: MapClaim | None = None) -> list[int]:
        """Send every encoded batch (all encoded before any is sent), round-robin, concurrently."""
        sends = []
        for groups, funcs, positions in blobs:
            q = next(self._rr) % self.n_queues
            # A function confirmed at a queue is not sent to it again.
            extra = {d: b for d, b in funcs.items() if d not in self._sent_funcs[q]}
            sends.append((q, groups, positions, self._call(q, "put_batch", encode_put(groups, extra))))
        ids = [0] * n
        for q, groups, positions, future in sends:
            allocated = self._answer(q, future)
            self._sent_funcs[q].update(g.digest for g in groups if g.digest is not None)
            for (first_seq, count), pos in zip(allocated, positions):
                if claim is not None:
                    self._collector.claim(q, first_seq, count, claim, pos[0])
                elif isinstance(pos, range) and pos.step == 1:
                    ids[pos.start : pos.stop] = [
                        (s << QUEUE_INDEX_BITS) | q for s in range(first_seq, first_seq + count)
                    ]
                else:
                    for k, p in enumerate(pos):
                        ids[p] = make_id(q, first_seq + k)
            self.submitted += sum(g.count for g in groups)
        return ids

    def _call(self, q: int, method: str, *args: Any) -> Any:
        """Call ``method`` of queue ``q``; its future. Dask refuses a call to an actor whose
        worker it knows to be dead right here, so that is translated too."""
        try:
            return getattr(self.queues[q], method)(*args)
        except Exception as e:
            self._raise_if_lost(q, e)
            raise

    def _answer(self, q: int, future: Any) -> Any:
        """The result of a call to queue ``q``, with a lost worker as :class:`QueueLostError`.

        Waits in slices, checking whether Dask has marked the queue lost: in distributed
        2026.8 a call in flight when the actor's worker dies can stay unanswered for good (its
        retry awaits the lost key's future inside a callback that then never sets the result).
        """
        while True:
            try:
                return future.result(timeout=LOST_CHECK_S)
            except TimeoutError as e:
                if future.done():
                    raise
                if actor_lost(self.queues[q]):
                    raise QueueLostError(q, self.queues[q]._address, self.durability) from e
            except Exception as e:
                self._raise_if_lost(q, e)
                raise

    def _raise_if_lost(self, q: int, error: BaseException) -> None:
        """Raise :class:`QueueLostError` from ``error`` if it says queue ``q``'s worker is gone."""
        if is_lost_worker(error):
            raise QueueLostError(q, self.queues[q]._address, self.durability) from error

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosedError(f"{self!r} is closed")

    @staticmethod
    def _check_options(priority: int, delay_s: float, type: str | None = None, key: str | None = None) -> None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigurationError(f"priority must be an int, got {priority!r}")
        if not -(2**31) <= priority < 2**31:
            raise ConfigurationError(f"priority must fit in 32 bits (durable queues store it so), got {priority}")
        _positive("delay_s", delay_s, allow_zero=True)
        for name, value in (("type", type), ("key", key)):
            if value is not None and not isinstance(value, str):
                raise ConfigurationError(f"{name} must be a str or None, got {value!r}")

    # -- inspection and lifetime ----------------------------------------------------------------

    def stats(self) -> list[QueueStats]:
        """A :class:`QueueStats` per queue, in queue order."""
        futures = [self._call(i, "stats") for i in range(self.n_queues)]
        return [self._answer(i, f) for i, f in enumerate(futures)]

    def get_queue_size(self) -> dict[int, int]:
        """Unsettled messages (ready, delayed or leased) per queue index."""
        return {s.index: s.pending for s in self.stats()}

    def close(self) -> None:
        """Close every queue (waiters are woken; later calls raise ``QueueClosedError``)."""
        if self._closed:
            return
        self._closed = True
        for f in [q.close() for q in self.queues]:
            try:
                f.result()
            except Exception as e:  # a dead worker must not stop the others closing
                logger.warning("closing a queue failed: %s", e)
        logger.info("%r closed", self)

    def __enter__(self) -> QueuePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
