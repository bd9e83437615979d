"""A consumer's calls to its queues: local ones awaited directly, remote ones with a deadline.

A queue actor on the consumer's own worker is called directly, as a coroutine on the same
event loop, instead of through Dask's actor RPC (which would serialize the call and send it
through a socket to the process it is already in). A call to a queue on another worker is
given up as soon as the pool reports that worker lost, and after its deadline otherwise.
A stopping consumer has its queues end the long polls it has waiting there (``end_waits``).
Event-loop only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from daskqueue import defaults
from daskqueue.errors import QueueCallTimeoutError, QueueHandedOffError, QueueLostError
from daskqueue.queue.handles import bind_local, worker_handle

__all__ = ["QueueCalls", "worker_address", "REMOTE_CALL_TIMEOUT_S"]

logger = logging.getLogger("daskqueue")

#: The deadline of a call to a queue on another worker, beyond the call's own wait. A call
#: to a queue whose worker died can stay unanswered for good inside Dask; the consumer
#: abandons it at once when the pool says that worker left (``workers_lost``), and after
#: this deadline otherwise.
REMOTE_CALL_TIMEOUT_S = 20.0

#: How long the answer of a call given up at its deadline is still awaited, to give back
#: what it holds (a fetch's lease): about a lease's life, after which it expired anyway.
LATE_ANSWER_WAIT_S = defaults.LEASE_TIMEOUT_S

#: How long a stopping consumer waits for its queues to end its long polls (``end_waits``).
END_WAITS_TIMEOUT_S = 5.0

#: Methods that ``call_moving`` may make twice and that must act once: each call of one gets
#: a random token as its last argument, the same for its second attempt (a queue that stored
#: the first, then handed itself off, hands the token over too and ignores the second).
ONCE_BY_TOKEN = frozenset({"record_outcomes"})
TOKEN_BYTES = 16


def worker_address() -> str | None:
    """The address of the worker this runs on (None off a worker)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


class QueueCalls:
    """The consumer's queues by index (a pool's queues may come and go), and calls to them.

    ``bind()`` (at start) swaps handles of queues in this process for the queue objects;
    ``workers_lost`` gives up calls in flight to those workers' queues at once, and fails
    later ones; a queue actor placed on such a worker's address later (a worker restarted
    under the address it died with, on a fixed port) is called as any other.
    """

    def __init__(self, refs: dict[int, Any]) -> None:
        self.queues: dict[int, Any] = {i: worker_handle(r) for i, r in refs.items()}
        self._bound = False
        self._dead: set[str] = set()  # workers reported lost
        # Lost address -> keys of queue actors placed there since (``move``, ``replace``).
        self._revived: dict[str, set[str]] = {}
        self._lost_event: asyncio.Event | None = None
        self._moved_event: asyncio.Event | None = None  # set (and renewed) when a queue moves
        self._late: set[asyncio.Task[None]] = set()  # answers awaited after their call gave up
        self._waiting: dict[int, int] = {}  # slot -> calls waiting there (wait_s > 0), see end_waits

    def bind(self) -> bool:
        """Bind queues in this process to their objects (and those set later, until
        ``unbind``); return whether any queue lives in this process."""
        handles = self.queues
        self.queues = {i: bind_local(q) for i, q in handles.items()}
        self._bound = True
        self._lost_event = asyncio.Event()
        self._moved_event = asyncio.Event()
        return any(self.queues[i] is not h for i, h in handles.items())

    def unbind(self) -> None:
        """Stopped: queues set from now on keep their handles (the consumer may move)."""
        self._bound = False

    def replace(self, refs: dict[int, Any]) -> None:
        """The queues are now ``refs`` (queue index -> handle or ref)."""
        queues = {i: worker_handle(r) for i, r in refs.items()}
        for i, handle in queues.items():
            if not _same_actor(self.queues.get(i), handle):  # a queue placed since (added)
                self._placed(handle)
        self.queues = {i: bind_local(h) for i, h in queues.items()} if self._bound else queues
        self._moved()

    def move(self, slot: int, ref: Any) -> None:
        """Queue ``slot`` moved to ``ref`` (reopened or handed off elsewhere)."""
        handle = worker_handle(ref)
        self.queues[slot] = bind_local(handle) if self._bound else handle
        self._placed(handle)
        self._moved()

    def _placed(self, handle: Any) -> None:
        """Queue actor ``handle`` was placed after this consumer was last told of lost
        workers: on a lost worker's address, that worker was restarted there (a fixed port)
        and the actor is alive, though the queues that were there before are not."""
        address, key = getattr(handle, "_address", None), getattr(handle, "key", None)
        if address in self._dead and key is not None:
            self._revived.setdefault(address, set()).add(key)

    def _lost(self, queue: Any) -> bool:
        """Whether ``queue``'s worker was reported lost (and the actor not placed since)."""
        address = getattr(queue, "_address", None)
        return address in self._dead and getattr(queue, "key", None) not in self._revived.get(address, ())

    def _moved(self) -> None:
        if self._moved_event is not None:
            self._moved_event.set()
            self._moved_event = asyncio.Event()

    def workers_lost(self, addresses: list[str]) -> None:
        """Give up calls in flight to queues on ``addresses``, and fail later ones at once."""
        self._dead.update(addresses)
        for address in addresses:  # lost again, with whatever was placed there since
            self._revived.pop(address, None)
        if self._lost_event is not None:
            self._lost_event.set()
            self._lost_event = asyncio.Event()

    async def call(self, slot: int, method: str, *args: Any, wait_s: float = 0.0,
                   deadline_s: float | None = None,
                   on_late: Callable[[Any], Awaitable[None]] | None = None,
                   until_moved: bool = False) -> Any:
        """``method(*args)`` of the queue in ``slot``. A remote call is given up (raising
        :class:`QueueLostError`) as soon as its worker is reported lost, or after
        ``deadline_s`` (default ``wait_s + REMOTE_CALL_TIMEOUT_S``), raising
        :class:`QueueCallTimeoutError`; a local call has no deadline (it is on this loop).

        Giving up does not stop the call at the queue: with ``on_late``, the answer of a
        call given up at its deadline is still awaited (for ``LATE_ANSWER_WAIT_S`` more,
        until ``close_late``) and handed to ``on_late`` (a fetch gives its lease back so).
        With ``until_moved``, a remote call is also given up as soon as the queue in
        ``slot`` moves (see ``call_moving``), raising :class:`_MovedMeanwhile`."""
        queue = self.queues.get(slot)
        call, address = self._start(slot, method, args)
        if wait_s > 0:
            self._waiting[slot] = self._waiting.get(slot, 0) + 1
        try:
            if address is None:
                return await call
            return await self._within(call, slot, queue, method,
                                      wait_s + REMOTE_CALL_TIMEOUT_S if deadline_s is None else deadline_s, on_late,
                                      moved_from=queue if until_moved else None)
        finally:
            if wait_s > 0:
                self._waiting[slot] -= 1
                if not self._waiting[slot]:
                    del self._waiting[slot]

    async def end_waits(self, owner: str | None) -> None:
        """The consumer stops: end its long polls now (``end_polls(owner)`` of every queue
        with a call waiting), so that stopping does not wait out their ``wait_s``. A poll
        ended so answers ``None``, or the batch it leased first, which the caller runs:
        nothing is lost. Best effort within ``END_WAITS_TIMEOUT_S``: a poll not ended
        still ends at its own deadline."""
        if owner is None:
            return
        slots = [slot for slot in self._waiting if slot in self.queues]
        ends = [self.call(slot, "end_polls", owner, deadline_s=END_WAITS_TIMEOUT_S) for slot in slots]
        for slot, result in zip(slots, await asyncio.gather(*ends, return_exceptions=True)):
            if isinstance(result, Exception):
                logger.debug("ending the long poll of queue %d failed (%s: %s)", slot, type(result).__name__, result)

    def queue(self, slot: int) -> Any:
        """The queue in ``slot``; :class:`QueueLostError` if it is no longer among this
        consumer's queues (the pool removed it, or replaced the set, while a call to it
        was due): for the caller, a queue gone like a lost one, never a bare ``KeyError``."""
        try:
            return self.queues[slot]
        except KeyError:
            raise QueueLostError(slot, "(none: no longer among this consumer's queues)", "unknown") from None

    def _start(self, slot: int, method: str, args: tuple[Any, ...]) -> tuple[Any, str | None]:
        queue = self.queue(slot)
        address = getattr(queue, "_address", None)
        if address is not None and self._lost(queue):
            raise QueueLostError(slot, address, "unknown")
        return getattr(queue, method)(*args), address

    async def _within(self, call: Any, slot: int, queue: Any, method: str, deadline_s: float,
                      on_late: Callable[[Any], Awaitable[None]] | None, *, moved_from: Any = None) -> Any:
        address = queue._address
        call = asyncio.ensure_future(call)
        lost = asyncio.ensure_future(self._until_lost(queue))
        watches = {call, lost}
        moved = None
        if moved_from is not None and self._moved_event is not None:  # (bound: started)
            moved = asyncio.ensure_future(self._until_moved(slot, moved_from))
            watches.add(moved)
        try:
            done, _ = await asyncio.wait(watches, timeout=deadline_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if moved is not None:
                moved.cancel()
        if call in done:
            return call.result()
        if moved is not None and moved in done:
            # The old actor refuses every call once its hand-off is final, and a call it
            # took before is in the state it handed over: nothing is lost by making this
            # one again at the successor. (A call to an actor its worker no longer holds
            # is never answered: Dask's actor proxy drops the KeyError.)
            call.cancel()
            raise _MovedMeanwhile(slot)
        if lost in done or on_late is None:
            call.cancel()
        else:
            task = asyncio.get_running_loop().create_task(self._late_answer(call, on_late))
            self._late.add(task)
            task.add_done_callback(self._late.discard)
        if lost in done:
            raise QueueLostError(slot, address, "unknown")
        raise QueueCallTimeoutError(slot, method, deadline_s, address)

    @staticmethod
    async def _late_answer(call: asyncio.Future[Any], on_late: Callable[[Any], Awaitable[None]]) -> None:
        try:
            answer = await asyncio.wait_for(call, LATE_ANSWER_WAIT_S)
        except Exception:  # no answer after all: nothing to hand over
            return
        await on_late(answer)

    async def close_late(self) -> None:
        """Stop awaiting the late answers of calls given up (the consumer stops)."""
        for task in list(self._late):
            task.cancel()
        await asyncio.gather(*self._late, return_exceptions=True)

    async def call_moving(self, slot: int, method: str, *args: Any, deadline_s: float | None = None) -> Any:
        """``call``, made again where the queue moved if it handed itself off meanwhile
        (its worker retires): the lease went with it, so the settlement still counts.

        Also made again there when the pool says where the queue went while the call is
        still unanswered, or when it failed because the old actor is gone and the pool
        said so meanwhile: a call sent just before the consumer learned of the move can
        reach the old worker after its actor was freed (and is then never answered).
        A method of ``ONCE_BY_TOKEN`` carries one token on every attempt, so that the old
        queue's work, handed over, is not done again."""
        if method in ONCE_BY_TOKEN:
            args = (*args, os.urandom(TOKEN_BYTES))
        for _ in range(2):
            queue = self.queue(slot)
            try:
                return await self.call(slot, method, *args, deadline_s=deadline_s, until_moved=True)
            except _MovedMeanwhile:
                logger.debug("queue %d moved while %s was under way; making it again there", slot, method)
            except QueueHandedOffError:
                deadline = time.monotonic() + defaults.MOVE_WAIT_S
                while self.queues.get(slot) is queue and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)  # until the pool says where it moved (move)
            except (QueueLostError, OSError, KeyError) as e:
                if _same_actor(self.queues.get(slot), queue) or not _actor_gone(e, queue):
                    raise
                logger.debug("queue %d: %s reached its old actor, which is gone (%s: %s); making it "
                             "again where the queue moved", slot, method, type(e).__name__, e)
        return await self.call(slot, method, *args, deadline_s=deadline_s)

    async def _until_moved(self, slot: int, queue: Any) -> None:
        while _same_actor(self.queues.get(slot), queue):
            assert self._moved_event is not None
            await self._moved_event.wait()

    async def _until_lost(self, queue: Any) -> None:
        while not self._lost(queue):
            assert self._lost_event is not None
            await self._lost_event.wait()


def _same_actor(a: Any, b: Any) -> bool:
    """Whether two of the consumer's queue handles call the same actor (``replace`` makes
    new handles for queues that did not move)."""
    if a is b:
        return True
    key = getattr(a, "key", None)
    return key is not None and key == getattr(b, "key", None) and getattr(a, "_address", None) == getattr(
        b, "_address", None)


def _actor_gone(error: BaseException, queue: Any) -> bool:
    """Whether ``error``, raised by a call to ``queue``, says that the actor is not there any
    more: its worker left (lost, or unreachable) or no longer holds it (Dask raises a
    ``KeyError`` of the actor's key)."""
    if isinstance(error, (QueueLostError, OSError)):
        return True
    return isinstance(error, KeyError) and error.args[:1] == (getattr(queue, "key", None),)


class _MovedMeanwhile(Exception):
    """A call given up because its queue moved meanwhile (see ``QueueCalls.call_moving``)."""
