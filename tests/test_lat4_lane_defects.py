"""Small defects of the lane's client side (branch lat4): each test fails before its fix."""

from __future__ import annotations

import concurrent.futures
import select
import threading
import time

import pytest

from daskqueue.queue import lane as lane_module
from daskqueue.queue import lane_connection
from tests import tasks


@pytest.mark.timeout(60)
def test_a_method_looked_up_while_the_lane_is_found_asks_the_lane_once(pools, monkeypatch):
    """``DirectActor.__getattr__`` asked its lane twice per put or poll while the lane's
    endpoint was being found (the short path, then the long one again)."""
    qp = pools.queue(1)
    handle = qp.queues[0]
    never = concurrent.futures.Future()  # a discovery that is never answered
    real_init = lane_module.LaneClient.__init__
    monkeypatch.setattr(lane_module.LaneClient, "__init__",
                        lambda self, discover, **kw: real_init(self, lambda: never, **kw))
    asked = []
    real_connection = lane_module.LaneClient.connection
    monkeypatch.setattr(lane_module.LaneClient, "connection", lambda self: asked.append(1) or real_connection(self))
    handle.close_lane()
    handle._lane, handle._lane_checked = None, False  # as a handle that has made no put yet
    for _ in range(3):
        assert callable(handle.fetch_outcomes)
    assert len(asked) == 3
    assert handle.lane_peer() is None
