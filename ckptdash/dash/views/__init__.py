"""The dashboard's views, one per file, each named for what it shows.

Each view takes the session's :class:`~ckptdash.dash.model.DashModel`, makes its own widgets,
and re-renders when the model's parameters change — which happens in the follower's thread,
so a notebook widget stays live while a cell blocks. Nothing here touches a file. This face
names the four views the page is built from; the others are imported from their modules.
"""

from __future__ import annotations

from ckptdash.dash.views.commands import CommandsView, render_commands
from ckptdash.dash.views.goodput import GoodputView, render_goodput
from ckptdash.dash.views.header import StatusHeader, render_header
from ckptdash.dash.views.runs import RunList

__all__ = [
    "CommandsView",
    "GoodputView",
    "RunList",
    "StatusHeader",
    "render_commands",
    "render_goodput",
    "render_header",
]
