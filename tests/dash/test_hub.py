"""The hub: one follower per path, shared by sessions, stopped with the last one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ckptdash.dash.feed.hub import FollowerHub

WaitUntil = Callable[..., None]


def test_hub_shares_one_follower_and_stops_it_with_the_last_user(
    make_run: Callable[..., Path], wait_until: WaitUntil
) -> None:
    """Two sessions of one path share a follower; it stops when the second is released."""
    root = make_run()
    hub = FollowerHub()
    first = hub.acquire(root)
    second = hub.acquire(str(root) + "/")
    assert first is second
    assert hub.users(first) == 2
    hub.release(first)
    assert first.running
    hub.release(second)
    wait_until(lambda: not first.running, what="the follower to stop")
    assert hub.users(first) == 0
    assert hub.followers() == []
