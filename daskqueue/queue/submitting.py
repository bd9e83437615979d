"""The submission API of ``QueuePool``: ``submit``, ``batch_submit``, ``map``, ``put``,
``put_many`` (and their ``_async`` forms).

A mixin of the facade: it validates a submission's options, encodes the messages (every
one before anything is sent, but for ``map``, which sends each batch as soon as it is
encoded), and hands the batches to the pool's ``sender`` (routed by its ``router``); ``map``
then waits on the pool's ``outcomes``. It uses only those public parts and ``_check_open``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Sequence

from distributed import Client

from daskqueue.errors import ConfigurationError, NoConsumersError
from daskqueue.messages import Kind
from daskqueue.queue.encode import (
    LazyBatches,
    PutBatch,
    PutOptions,
    calls_from_tasks,
    chunk_size,
    encode_calls,
    encode_payloads,
    encode_uniform,
    pack_bound,
)
from daskqueue.queue.options import Eta, put_options
from daskqueue.queue.router import batch_count, consecutive_runs, waves
from daskqueue.queue.sending import check_keys
from daskqueue.queue.stream_parts import is_lost, unstored_positions
from daskqueue.results import MapClaim
from daskqueue.serialize import PickledFunction, pickle_function
from daskqueue.validate import check_choice

__all__ = ["Submitting", "MapPut", "check_key_function", "not_in_client_loop"]


def not_in_client_loop(client: Client | None) -> None:
    """Raise :class:`ConfigurationError` if called in an asynchronous client's event loop,
    where a blocking call would wait forever for the loop it blocks."""
    if client is not None and client.asynchronous:  # None: a handle inside a task
        raise ConfigurationError("this call blocks, and it was made in the event loop of an asynchronous "
                                 "Client: use its *_async form (await qp.map_async(...), "
                                 "await cp.join_async(), async for ... in cp.as_completed_async())")


def _call_payload(call: tuple[Any, ...]) -> tuple[int, Any, Any]:
    """``(kind, function, payload)`` of a ``(func, args, kwargs)`` call."""
    func, args, kwargs = call
    return (Kind.CALL_KW, func, (args, kwargs)) if kwargs else (Kind.CALL, func, args)


@dataclass(frozen=True)
class MapPut:
    """A map's messages, encoded: by key (``keyed``, sent in waves) or spread (``batches``)."""

    batches: list[PutBatch] | LazyBatches | None = None
    keyed: list[tuple[int, PutBatch]] | None = None


def check_key_function(key: Any) -> None:
    """``map``'s ``key=``: None or a callable item -> str."""
    if key is not None and not callable(key):
        raise ConfigurationError(f"key must be a callable item -> str, got {key!r:.80}")


def _progress_bar(total: int) -> Any:
    """A tqdm bar for ``total`` tasks (tqdm is imported only when a bar is asked for)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="task", desc="daskqueue")


class Submitting:
    """Submitting work to a pool (see the module docstring)."""

    config: Any
    time_limit_s: float | None
    sender: Any
    router: Any
    outcomes: Any
    collector: Any

    def submit(self, func: Callable[..., Any], *args: Any, dq_type: str | None = None, dq_priority: int = 0,
               dq_key: str | None = None, dq_delay_s: float = 0.0, dq_eta: Eta = None,
               dq_time_limit_s: float | None = None, **kwargs: Any) -> int:
        """Enqueue ``func(*args, **kwargs)``; return its task id.

        The ``dq_`` keywords are the message's own options (the others go to ``func``): its
        ``type``, ``priority``, routing ``key``, and a delay (``dq_delay_s``) or a due time
        (``dq_eta``, a ``datetime`` or epoch seconds) before which it does not run, and
        ``dq_time_limit_s``: how long it may run (see :meth:`batch_submit`).
        """
        options = self._put_options(dq_type, dq_priority, dq_key, dq_delay_s, dq_eta, dq_time_limit_s)
        return self.sender.send(encode_calls([(func, args, kwargs)], options, **self._encoding(1, options)), n=1,
                                queue=self._route(options))[0]

    def batch_submit(
        self,
        tasks: Iterable[Sequence[Any]],
        *,
        type: str | None = None,
        priority: int = 0,
        key: str | None = None,
        delay_s: float = 0.0,
        eta: Eta = None,
        keys: Sequence[str] | None = None,
        time_limit_s: float | None = None,
    ) -> list[int]:
        """Enqueue tasks given as tuples ``(func, *args)``; return their ids, in order.

        Every task is validated and pickled before anything is sent: an unpicklable or
        non-callable task raises (naming its index) and enqueues nothing. Each distinct
        function is pickled once per call. ``keys`` (one per task): tasks with the same key
        go to one queue and run one at a time, in this order (see the README's "Routing by
        key"). ``time_limit_s`` (default: the pool's): a task still running after that long is
        interrupted and counts as a failed attempt (see the README's "Time limits").
        """
        options = self._put_options(type, priority, key, delay_s, eta, time_limit_s)
        tasks = tasks if isinstance(tasks, list) else list(tasks)
        if keys is not None:
            calls = calls_from_tasks(tasks)
            keyed = self._keyed(options, self._check_keys(keys, len(tasks), key),
                                lambda i: _call_payload(calls[i]), what="arguments")
            return self.sender.send_keyed(keyed, len(tasks))
        encoding = self._encoding(len(tasks), options)
        batches = encode_uniform(tasks, options, **encoding)
        if batches is None:
            batches = encode_calls(calls_from_tasks(tasks), options, **encoding)
        return self.sender.send(batches, n=len(tasks), queue=self._route(options))

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
        delay_s: float = 0.0,
        eta: Eta = None,
        key: Callable[[Any], str] | None = None,
        time_limit_s: float | None = None,
    ) -> list[Any]:
        """Run ``func(x)`` for each ``x`` on the cluster; return the results in input order.

        Needs a started ``ConsumerPool`` on this pool. ``progress=True`` shows a tqdm bar with
        done / failed / rate. A task that fails on its last retry: with ``errors="raise"`` the
        first such :class:`RemoteTaskError` (by input position) is raised once every task is
        settled; with ``errors="return"`` it takes the task's place in the list. Raises
        :class:`JoinTimeoutError` after ``timeout_s``.

        The tasks are sent batch by batch as their arguments are pickled (the first batch
        runs while the next are pickled). An argument that cannot be pickled (or is too
        large) raises :class:`SerializationError` (:class:`PayloadTooLargeError`) naming its
        position: in the first batch, with nothing sent; later, once the batches before it
        are stored: those tasks still run, and their outcomes are dropped.

        A map that raises for any reason once tasks are stored (a put refused or failed
        part-way, that bad argument, its timeout, no consumer left, an interrupt) leaves those
        tasks to run, and their outcomes are dropped as they arrive: a map keeps its outcomes
        to itself, so none is ever filed with ``results()`` (the caller has no id for them),
        as for a stream closed early (:meth:`imap`). But a lost transient queue: its
        outcomes never come, and every poll raises from then on.
        """
        check_choice("errors", errors, ("raise", "return"))
        options = self._put_options(type, priority, None, delay_s, eta, time_limit_s)
        if not self.has_running_consumers():
            raise NoConsumersError(f"map() needs a started ConsumerPool on {self!r}: create one "
                                   "and call start() first")
        started = time.monotonic()
        # An immutable sequence is read as it is, chunk by chunk (a range of a million
        # items never exists as a list here); anything else is read once, now.
        items = iterable if isinstance(iterable, (range, tuple)) else list(iterable)
        check_key_function(key)
        encoded = self._encode_map(func, items, options, key, lazy=True)
        claim = MapClaim(len(items))
        bar = _progress_bar(claim.n) if progress else None
        release = self.collector.release
        # Ids are listed only where a wave's failure needs those of the waves before it.
        ids: list[int | None] | None = [None] * claim.n if encoded.keyed is not None else None
        unstored: Sequence[int] = ()
        try:
            try:
                self._send_map(encoded, claim, options, ids)
            except BaseException as e:
                unstored = unstored_positions(e, ids, encoded, claim.n)
                raise
            if isinstance(encoded.batches, LazyBatches) and encoded.batches.error is not None:
                unstored = range(encoded.batches.encoded, claim.n)
                encoded.batches.raise_error()
            deadline = None if timeout_s is None else started + timeout_s
            return self.outcomes.wait_map(claim, bar=bar, deadline=deadline, timeout_s=timeout_s, errors=errors)
        except BaseException as e:
            release = self._dropped(claim, unstored, lost=is_lost(e))
            raise
        finally:
            release(claim)
            if bar is not None:
                bar.close()

    def _dropped(self, claim: MapClaim, unstored: Sequence[int], *, lost: bool) -> Callable[[MapClaim], None]:
        """A map raised: nobody reads its claim any more. Its ``unstored`` positions (no queue
        stored them) count as settled, and it is released once the tasks stored all arrive,
        their outcomes dropped then, never filed with ``results()`` (the caller has no id for
        them). ``lost``: a transient queue was lost, whose outcomes never come: released at
        once. Returns what releases it."""
        if lost:
            return self.collector.release
        for _, count, start in consecutive_runs(0, unstored):
            claim.succeed(start, [None] * count)
        return lambda c: self.collector.release_when_complete([c])

    def _encode_map(self, func: Callable[..., Any], items: Sequence[Any], options: PutOptions,
                    key: Callable[[Any], str] | None, function: PickledFunction | None = None, *,
                    lazy: bool = False) -> MapPut:
        """Every message of ``func(x) for x in items``, encoded (nothing is sent yet: an item
        that cannot be pickled raises here). ``function``: ``func`` pickled already (a stream
        pickles it once, not once per chunk). ``lazy``: only the first batch is encoded now
        (an error in it raises here), the others as :meth:`_send_map` sends them (a
        :class:`LazyBatches`, whose ``error`` the caller checks after the send)."""
        if key is not None:
            keyed = self._keyed(options, self._check_keys([key(x) for x in items], len(items)),
                                lambda i: (Kind.CALL, func, (items[i],)), what="argument")
            return MapPut(keyed=keyed)
        batches = encode_payloads(
            items, None, kind=Kind.CALL, function=function or pickle_function(func), options=options,
            what="argument", lazy=lazy, one_argument=True, **self._encoding(len(items), options),
        )
        return MapPut(batches=batches.first() if isinstance(batches, LazyBatches) else batches)

    def _send_map(self, encoded: MapPut, claim: MapClaim, options: PutOptions,
                  ids: list[int | None] | None = None) -> None:
        """Send a map's encoded messages, their outcomes routed to ``claim`` (by position).
        A send that fails part-way raises with ``stored_ids`` (None where no queue stored the
        message); keyed, the waves' ids are noted in ``ids`` as they are stored (a failed
        wave's error knows only its own)."""
        if encoded.keyed is not None:
            for wave in waves(encoded.keyed):
                self.sender.send([b for _, b in wave], claim=claim, queues=[q for q, _ in wave], into=ids)
        else:
            self.sender.send(encoded.batches, n=claim.n, claim=claim, queue=self._route(options))  # type: ignore[arg-type]

    # -- raw items ----------------------------------------------------------------------------

    def put(self, item: Any, *, type: str | None = None, priority: int = 0, key: str | None = None,
            delay_s: float = 0.0, eta: Eta = None, time_limit_s: float | None = None) -> int:
        """Enqueue one raw item for a custom consumer; return its message id."""
        return self.put_many([item], type=type, priority=priority, key=key, delay_s=delay_s, eta=eta,
                             time_limit_s=time_limit_s)[0]

    def put_many(self, items: Iterable[Any], *, type: str | None = None, priority: int = 0,
                 key: str | None = None, delay_s: float = 0.0, eta: Eta = None,
                 keys: Sequence[str] | None = None, time_limit_s: float | None = None) -> list[int]:
        """Enqueue raw items (each pickled on its own) for a custom consumer; return their ids.

        Every enqueue call takes the same message options: ``type`` (what a fair or capped
        pool schedules by), ``priority`` (higher first), ``key``, and ``delay_s`` or ``eta``
        (a ``datetime`` or epoch seconds): the messages do not run before then.
        """
        options = self._put_options(type, priority, key, delay_s, eta, time_limit_s)
        items = list(items)
        if keys is not None:
            keyed = self._keyed(options, self._check_keys(keys, len(items), key),
                                lambda i: (Kind.RAW, None, items[i]), what="item")
            return self.sender.send_keyed(keyed, len(items))
        batches = encode_payloads(
            items, None, kind=Kind.RAW, function=None, options=options, what="item",
            **self._encoding(len(items), options),
        )
        return self.sender.send(batches, n=len(items), queue=self._route(options))


    # -- options and encoding -------------------------------------------------------------------

    def _put_options(self, type: str | None = None, priority: int = 0, key: str | None = None,
                     delay_s: float = 0.0, eta: Eta = None, time_limit_s: float | None = None) -> PutOptions:
        """The validated options of a submission; raises :class:`QueueClosedError` first if
        the pool is closed."""
        self._check_open()  # type: ignore[attr-defined]
        return put_options(type, priority, key, delay_s, eta,
                           self.time_limit_s if time_limit_s is None else time_limit_s, typed=self._typed())

    def _typed(self) -> str | None:
        """The scheduler of a pool that routes by type, else None."""
        return self.config.scheduler if self.router.typed else None

    def _route(self, options: PutOptions) -> int | None:
        return self.router.route(options.type, options.key)

    def _encoding(self, n: int, options: PutOptions) -> dict[str, int]:
        """The chunking, message size limit and packing of a submission of ``n`` messages
        (the encoders' ``size``, ``batches``, ``limit`` and ``pack_max_bytes``): whole rounds
        of one batch per queue, of sizes that differ by at most one, so that round-robin
        spreads the call evenly."""
        spread = self.router.spread(self._route(options))
        put_batch_size = self.config.put_batch_size
        limit = self.config.message_limit(options.type, options.key)
        return {
            "size": chunk_size(n, n_queues=spread, put_batch_size=put_batch_size),
            "batches": batch_count(n, spread=spread, put_batch_size=put_batch_size),
            "limit": limit,
            "pack_max_bytes": pack_bound(n, options, limit, durable=self.config.durability == "durable"),
        }

    def _check_keys(self, keys: Sequence[Any], n: int, key: str | None = None) -> list[str]:
        return check_keys(keys, n, key=key, typed=self._typed())

    def _keyed(self, options: PutOptions, keys: list[str], payload_of: Callable[[int], Any],
               what: str) -> list[tuple[int, PutBatch]]:
        return self.sender.keyed(keys, payload_of, options, size=self.config.put_batch_size,
                                 limit=self.config.message_limit(options.type), what=what)

    # -- the same from an event loop (an asynchronous Client, a notebook cell, a service) -------

    async def map_async(self, func: Callable[..., Any], iterable: Iterable[Any], **kwargs: Any) -> list[Any]:
        """:meth:`map`, awaited: it runs on a thread, so the event loop (and an asynchronous
        Client's calls) go on meanwhile."""
        items = list(iterable)
        return await asyncio.to_thread(self.map, func, items, **kwargs)

    async def batch_submit_async(self, tasks: Iterable[Sequence[Any]], **kwargs: Any) -> list[int]:
        """:meth:`batch_submit`, awaited (on a thread)."""
        tasks = list(tasks)
        return await asyncio.to_thread(self.batch_submit, tasks, **kwargs)

    async def put_many_async(self, items: Iterable[Any], **kwargs: Any) -> list[int]:
        """:meth:`put_many`, awaited (on a thread)."""
        items = list(items)
        return await asyncio.to_thread(self.put_many, items, **kwargs)

    async def result_async(self, task_id: int, timeout_s: float | None = None) -> Any:
        """:meth:`result`, awaited (on a thread)."""
        return await asyncio.to_thread(self.result, task_id, timeout_s)  # type: ignore[attr-defined]
