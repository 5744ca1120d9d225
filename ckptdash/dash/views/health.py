"""The dashboard's health views: a banner of the alerts that hold now, and every rank of the
current attempt grouped by node, with stragglers and silent ranks marked.

Both read only the selected run's snapshot (its :class:`~ckptdash.analysis.health.Facts`) and the
follower's clock, and run :func:`ckptdash.analysis.health.detect` again as the clock moves: a job
that
went quiet becomes ``stale`` on screen without a new event. Thresholds are the run's own
(``ckptdash health RUN --set``), else the defaults. Nothing here touches a file.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

import panel as pn
import param
from panel.reactive import ReactiveHTML

from ckptdash import humanize
from ckptdash.analysis import health
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.model import rates
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.widgets import HtmlView
from ckptdash.errors import CkptDashError
from ckptdash.state.records import RankInfo

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
    "crash_loop": "crash loop",
    "lost": "process lost",
}


def thresholds_of(snap: RunSnapshot, stale_after_s: float | None = None) -> health.Thresholds:
    """The run's thresholds from its settings (the defaults where they cannot be read);
    ``stale_after_s`` (the dashboard's ``--stale-after``) unless the run sets its own."""
    stored = dict(snap.settings.health) if snap.settings is not None else {}
    if stale_after_s is not None and stale_after_s > 0:
        stored.setdefault("stale_after_s", stale_after_s)
    try:
        return health.Thresholds().updated(stored)
    except CkptDashError:
        return health.Thresholds()


def alerts_of(
    snap: RunSnapshot | None, now: float, stale_after_s: float | None = None
) -> list[health.Alert]:
    """The alerts that hold for ``snap`` at ``now``."""
    if snap is None or snap.health is None:
        return []
    return health.detect(snap.health, thresholds_of(snap, stale_after_s), now, gone=snap.gone)


def render_banner(snap: RunSnapshot | None, now: float, stale_after_s: float | None = None) -> str:
    """The banner's HTML: one line per alert that holds; empty when the run is healthy."""
    alerts = alerts_of(snap, now, stale_after_s)
    if not alerts:
        return ""
    rows = "".join(
        f'<div class="alert" data-alert="{esc(a.kind)}"><b>{esc(LABELS.get(a.kind, a.kind))}</b>'
        f" <span class='muted'>since {esc(humanize.age(a.since, now))}</span>"
        f" — {esc(a.detail)}</div>"
        for a in alerts
    )
    return (
        '<div class="ck" style="border-left:4px solid #c92a2a;background:var(--ck-alert-bg);'
        f'padding:6px 10px;border-radius:4px">{rows}</div>'
    )


class BrowserNotifier(ReactiveHTML):  # type: ignore[misc]
    """Opt-in browser notifications: a button asks the browser's permission; from then on each
    new ``note`` shows as a system notification (``Notification`` API), even while the tab
    is in the background. Off until the user clicks: nothing is asked of the browser before."""

    enabled = param.Boolean(default=False, doc="The user turned notifications on (and allowed).")
    note = param.String(default="", doc="The latest alert; a change notifies once.")

    _template = (
        '<button id="toggle" type="button" title="Get a browser notification when an alert'
        ' begins (asks the browser for permission)" style="font-size:12px;padding:1px 8px;'
        "border:1px solid #ced4da;border-radius:4px;background:transparent;"
        "color:var(--jp-content-font-color1, inherit);"
        'cursor:pointer"'
        " onclick=\"${script('toggle')}\">Browser notifications: off</button>"
    )
    _scripts: Final = {
        "render": "toggle.textContent = 'Browser notifications: ' + (data.enabled ? 'on' : 'off')",
        "enabled": "toggle.textContent = 'Browser notifications: ' + (data.enabled ? 'on' : 'off')",
        "toggle": """
            if (data.enabled) { data.enabled = false; return }
            if (!('Notification' in window)) {
              toggle.textContent = 'Browser notifications: not supported by this browser'; return
            }
            Notification.requestPermission().then((answer) => {
              data.enabled = answer === 'granted'
              if (answer !== 'granted') {
                toggle.textContent = 'Browser notifications: blocked (allow them for this site)'
              }
            })
        """,
        "note": """
            if (data.enabled && data.note && window.Notification
                && Notification.permission === 'granted') {
              new Notification('ckptdash', {body: data.note.replace(/ #[0-9]+$/, '')})
            }
        """,
    }


class HealthBanner(HtmlView):
    """The alerts of the selected run, re-evaluated at every refresh of the clock, and the
    opt-in browser notification of each alert as it begins."""

    WATCH = ("run", "now", "stale_after_s")

    def __init__(self, model: Any, **params: Any) -> None:
        self.notifier = BrowserNotifier(margin=(0, 10))
        self._seen: set[tuple[str, str]] = set()
        self._sent = 0
        super().__init__(model, **params)
        self._layout = pn.Column(self._pane, self.notifier, sizing_mode="stretch_width")

    def __panel__(self) -> Any:
        return self._layout

    def html(self) -> str:
        snap, now = self.model.run, self.model.now or time.time()
        stale = self.model.stale_after_s
        alerts = alerts_of(snap, now, stale)
        self._notify(snap, alerts)
        return render_banner(snap, now, stale)

    def _notify(self, snap: RunSnapshot | None, alerts: list[health.Alert]) -> None:
        """One notification per alert as it begins (a run's alert seen before is not new)."""
        if snap is None:
            return
        current = {(snap.root, a.kind) for a in alerts}
        new = [a for a in alerts if (snap.root, a.kind) not in self._seen]
        # Forget the ones that cleared, so their next episode notifies again.
        self._seen = {k for k in self._seen if k[0] != snap.root} | current
        # Always sent: the browser shows it only if the user turned notifications on there
        # (decided in the page, so a click just before an alert is never lost in transit).
        if new:
            self._sent += 1
            a = new[0]
            more = f" (+{len(new) - 1} more)" if len(new) > 1 else ""
            label = LABELS.get(a.kind, a.kind)
            self.notifier.note = f"{snap.name}: {label}: {a.detail}{more} #{self._sent}"


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


WIDE_RANKS: Final = 64
"""Above this many ranks a node is one line (its ranks, their step range) and only the marked
ranks get a chip: 1,024 chips were 300 kB of HTML, re-sent at every change."""


def render_ranks(snap: RunSnapshot | None, now: float) -> str:
    """The newest attempt's ranks grouped by node (host), marking stragglers and silent ranks.

    Nothing in it changes with the clock alone (no "seen N s ago" per rank): the page gets a
    new one only when a rank's step or mark changed."""
    if snap is None or snap.health is None or not snap.health.ranks:
        return ""
    ranks = snap.health.ranks
    newest = snap.newest
    running = newest is not None and newest.outcome == "running"
    marks = rank_marks(ranks, now, rates(snap, now).steps_per_s) if running else {}
    by_host: dict[str, list[RankInfo]] = {}
    for r in ranks:
        by_host.setdefault(r.host or "?", []).append(r)
    wide = len(ranks) > WIDE_RANKS
    rows = []
    for host in sorted(by_host):
        members = by_host[host]
        chips = "".join(
            _chip(r, marks.get(r.rank, "")) for r in members if not wide or r.rank in marks
        )
        if wide:
            steps = [r.step for r in members if r.step is not None]
            span = (
                f"{humanize.number(min(steps))}–{humanize.number(max(steps))}"
                if steps
                else humanize.DASH
            )
            chips = f"<span class='muted'>{len(members)} ranks, steps {span}</span> {chips}"
        rows.append(f"<tr><td><code>{esc(host)}</code></td><td>{chips}</td></tr>")
    attempt = "" if newest is None else f" of attempt {newest.attempt}"
    silent = sum(1 for m in marks.values() if m == "silent")
    lagging = sum(1 for m in marks.values() if m == "straggler")
    summary = f"{len(ranks)} rank(s) on {len(by_host)} node(s)"
    if silent or lagging:
        summary += f" · <span class='problem'>{silent} silent, {lagging} straggler(s)</span>"
    if wide:
        summary += " · only silent ranks and stragglers are shown one by one"
    return (
        f'<div class="ck"><h4>Ranks{attempt} <span class="muted">{summary}</span></h4>'
        f"<table><tr><th>node</th><th>ranks (step)</th></tr>{''.join(rows)}</table></div>"
    )


def _chip(r: RankInfo, mark: str) -> str:
    color = {"silent": "#c92a2a", "straggler": "#e8590c"}.get(mark, "#2f9e44")
    return (
        f'<span class="rank" data-rank="{r.rank}" data-mark="{mark}"'
        f' title="rank {r.rank}: step {esc(humanize.number(r.step))}"'
        f' style="display:inline-block;margin:1px 3px;padding:1px 6px;border-radius:8px;'
        f'border:1px solid {color};color:{color}">{r.rank}'
        f" <span class='muted'>{humanize.number(r.step)}</span>"
        + (f" <b>{mark}</b>" if mark else "")
        + "</span>"
    )


class RanksView(HtmlView):
    """Every rank of the selected run's newest attempt, by node (the pulse of each rank)."""

    WATCH = ("run", "now")

    def html(self) -> str:
        return render_ranks(self.model.run, self.model.now or time.time())
