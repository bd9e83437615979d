"""Who uses a client's :class:`~daskqueue.membership.Membership`: started with the first
pool of a client, stopped (its thread ended, the client no longer held) with the last."""

from __future__ import annotations

import threading
from typing import Any

from daskqueue.membership import Membership, forget, membership

__all__ = ["use", "release"]

_users: dict[str, int] = {}
_lock = threading.Lock()


def use(client: Any) -> Membership:
    """The membership of ``client``, for one more pool."""
    with _lock:
        _users[client.id] = _users.get(client.id, 0) + 1
        return membership(client)


def release(client: Any) -> None:
    """One pool of ``client`` closed; the last one stops its membership."""
    with _lock:
        left = _users.get(client.id, 0) - 1
        if left > 0:
            _users[client.id] = left
            return
        _users.pop(client.id, None)
        forget(client)  # under the lock: a pool starting now must not get the stopped one
