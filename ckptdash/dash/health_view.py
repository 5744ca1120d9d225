"""The dashboard's health views: a banner of the alerts that hold now, and every rank of the
current attempt grouped by node, with stragglers and silent ranks marked.

Both read only the selected run's snapshot (its :class:`~ckptdash.health.Facts`) and the
watcher's clock, and run :func:`ckptdash.health.detect` again as the clock moves: a job that
went quiet becomes ``stale`` on screen without a new event. Thresholds are the run's own
(``ckptdash health RUN --set``), else the defaults. Nothing here touches a file.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

from ckptdash import health
from ckptdash.dash import text
from ckptdash.dash.model import rates
from ckptdash.dash.snapshot import RunSnapshot
from ckptdash.dash.text import esc
from ckptdash.dash.views import HtmlView
from ckptdash.errors import CkptDashError
from ckptdash.records import RankInfo

SILENT_AFTER_S: Final = 10.0
"""A pulsing rank whose last pulse is older than this is marked silent (pulses come every ~1 s;
host clocks may disagree by a few seconds)."""

STRAGGLER_S: Final = 3.0
"""A rank more than this many seconds of steps behind the furthest rank is a straggler."""

LABELS: Final = {
    "hung": "hung",
    "stale": "stale",
    "restart_storm": "restart storm",
    "stalled_progress": "stalled progress",
    "budget_low": "requeue budget low",
    "save_margin_negative": "signal save too late",
    "checkpoint_failures": "checkpoint failures",
}


def thresholds_of(snap: RunSnapshot) -> health.Thresholds:
    """The run's thresholds from its settings (the defaults where they cannot be read)."""
    stored = snap.settings.health if snap.settings is not None else {}
    try:
        return health.Thresholds().updated(dict(stored))
    except CkptDashError:
        return health.Thresholds()


def alerts_of(snap: RunSnapshot | None, now: float) -> list[health.Alert]:
    """The alerts that hold for ``snap`` at ``now``."""
    if snap is None or snap.health is None:
        return []
    return health.detect(snap.health, thresholds_of(snap), now)


def render_banner(snap: RunSnapshot | None, now: float) -> str:
    """The banner's HTML: one line per alert that holds; empty when the run is healthy."""
    alerts = alerts_of(snap, now)
    if not alerts:
        return ""
    rows = "".join(
        f'<div class="alert" data-alert="{esc(a.kind)}"><b>{esc(LABELS.get(a.kind, a.kind))}</b>'
        f" <span class='muted'>since {esc(text.age(a.since, now))}</span>"
        f" — {esc(a.detail)}</div>"
        for a in alerts
    )
    return (
        '<div class="ck" style="border-left:4px solid #c92a2a;background:#fff5f5;'
        f'padding:6px 10px;border-radius:4px">{rows}</div>'
    )


class HealthBanner(HtmlView):
    """The alerts of the selected run, re-evaluated at every refresh of the clock."""

    WATCH = ("run", "now")

    def html(self) -> str:
        return render_banner(self.model.run, self.model.now or time.time())


def rank_marks(ranks: Sequence[RankInfo], now: float, steps_per_s: float | None) -> dict[int, str]:
    """``silent`` or ``straggler`` for the ranks that are; the others are left out."""
    marks: dict[int, str] = {}
    top = max((r.step for r in ranks if r.step is not None), default=None)
    lag_steps = max(2.0, STRAGGLER_S * (steps_per_s or 0.0))
    for r in ranks:
        if r.pulses and r.last_seen is not None and now - r.last_seen > SILENT_AFTER_S:
            marks[r.rank] = "silent"
        elif top is not None and r.step is not None and top - r.step > lag_steps:
            marks[r.rank] = "straggler"
    return marks


def render_ranks(snap: RunSnapshot | None, now: float) -> str:
    """The newest attempt's ranks grouped by node (host), marking stragglers and silent ranks."""
    if snap is None or snap.health is None or not snap.health.ranks:
        return ""
    ranks = snap.health.ranks
    newest = snap.newest
    running = newest is not None and newest.outcome == "running"
    marks = rank_marks(ranks, now, rates(snap, now).steps_per_s) if running else {}
    by_host: dict[str, list[RankInfo]] = {}
    for r in ranks:
        by_host.setdefault(r.host or "?", []).append(r)
    rows = []
    for host in sorted(by_host):
        cells = []
        for r in by_host[host]:
            mark = marks.get(r.rank, "")
            color = {"silent": "#c92a2a", "straggler": "#e8590c"}.get(mark, "#2f9e44")
            title = (
                f"rank {r.rank}: step {text.number(r.step)}, last seen {text.age(r.last_seen, now)}"
            )
            cells.append(
                f'<span class="rank" data-rank="{r.rank}" data-mark="{mark}" title="{esc(title)}"'
                f' style="display:inline-block;margin:1px 3px;padding:1px 6px;border-radius:8px;'
                f'border:1px solid {color};color:{color}">{r.rank}'
                f" <span class='muted'>{text.number(r.step)}</span>"
                + (f" <b>{mark}</b>" if mark else "")
                + "</span>"
            )
        rows.append(f"<tr><td><code>{esc(host)}</code></td><td>{''.join(cells)}</td></tr>")
    attempt = "" if newest is None else f" of attempt {newest.attempt}"
    silent = sum(1 for m in marks.values() if m == "silent")
    lagging = sum(1 for m in marks.values() if m == "straggler")
    summary = f"{len(ranks)} rank(s) on {len(by_host)} node(s)"
    if silent or lagging:
        summary += f" · <span class='problem'>{silent} silent, {lagging} straggler(s)</span>"
    return (
        f'<div class="ck"><h4>Ranks{attempt} <span class="muted">{summary}</span></h4>'
        f"<table><tr><th>node</th><th>ranks (step)</th></tr>{''.join(rows)}</table></div>"
    )


class RanksView(HtmlView):
    """Every rank of the selected run's newest attempt, by node (the pulse of each rank)."""

    WATCH = ("run", "now")

    def html(self) -> str:
        return render_ranks(self.model.run, self.model.now or time.time())
