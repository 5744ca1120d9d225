"""The command list: each command, newest first, with the job's answer."""

from __future__ import annotations

from typing import Final

from ckptdash import humanize
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.views import text
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.widgets import HtmlView


class CommandsView(HtmlView):
    """The run's commands, newest first: pending until the job answers applied/rejected/expired."""

    LIMIT: Final = 8

    def html(self) -> str:
        snap = self.model.run
        return "" if snap is None else render_commands(snap, self.LIMIT)


def render_commands(snap: RunSnapshot, limit: int) -> str:
    """The command list's HTML."""
    if not snap.commands:
        return "<div class='ck'><h4>Commands</h4><span class='muted'>none yet</span></div>"
    rows = []
    for c in snap.commands[:limit]:
        answer = c.reason or c.error
        shown = (
            text.path_html(c.detail, snap.root)
            if c.detail
            else (f"<code>{esc(answer)}</code>" if answer else "")
        )
        rows.append(
            f"<tr><td>{humanize.clock(c.issued_at or c.received_at)}</td>"
            f"<td>{esc(c.command or '?')}</td><td>{esc((c.author or '?') + c.spoof_note)}</td>"
            f"<td class='st st-{esc(c.status)}'>{esc(c.status)}</td>"
            f"<td>{shown}</td></tr>"
        )
    return (
        "<div class='ck'><h4>Commands</h4><table><tr><th>issued</th><th>command</th>"
        "<th>by</th><th>status</th><th>answer</th></tr>" + "".join(rows) + "</table></div>"
    )
