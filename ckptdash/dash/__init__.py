"""The dashboard: watch a run directory, show it, steer it (Panel).

Only :mod:`ckptdash.dash.app`, :mod:`ckptdash.dash.server` and the view modules import Panel;
the model, the goodput figures and the follower are plain Python, so this package's
``__init__`` imports nothing until a name is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptdash.dash.app import Dashboard, DashOptions, dashboard
    from ckptdash.dash.feed.follow import RunFollower
    from ckptdash.dash.feed.hub import FollowerHub
    from ckptdash.dash.server import RunningServer, ServeOptions, serve, start_server

__all__ = [
    "DashOptions",
    "Dashboard",
    "FollowerHub",
    "RunFollower",
    "RunningServer",
    "ServeOptions",
    "dashboard",
    "serve",
    "start_server",
]

_WHERE = {name: "ckptdash.dash.app" for name in __all__} | {
    "RunFollower": "ckptdash.dash.feed.follow",
    "RunningServer": "ckptdash.dash.server",
    "ServeOptions": "ckptdash.dash.server",
    "serve": "ckptdash.dash.server",
    "start_server": "ckptdash.dash.server",
    "FollowerHub": "ckptdash.dash.feed.hub",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
