"""The goodput panel's bars: where the run's time went, one stacked bar per attempt and one for
the run (productive, startup, saving, lost work, requeue wait, other). The numbers are
:mod:`ckptdash.analysis.goodput`'s, the same as ``ckptdash goodput`` prints; nothing here reads a
file."""

from __future__ import annotations

from typing import Final

from ckptdash import humanize
from ckptdash.analysis import goodput
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.widgets import HtmlView

COLORS: Final = {
    "productive": "#2f9e44",
    "startup": "#74c0fc",
    "saving": "#4c78a8",
    "lost_work": "#e03131",
    "requeue_wait": "#f08c00",
    "other": "#adb5bd",
}
LABELS: Final = {
    "productive": "productive",
    "startup": "startup",
    "saving": "saving",
    "lost_work": "lost work",
    "requeue_wait": "requeue wait",
    "other": "other",
}
MAX_ATTEMPT_BARS: Final = 12
"""Bars for the newest attempts only: a run requeued 200 times still fits the panel."""

_CSS: Final = """
<style>
.ck .gp-row { display: grid; grid-template-columns: 86px 1fr 64px; gap: 8px; align-items: center;
              margin: 2px 0; }
.ck .gp-bar { display: flex; height: 14px; border-radius: 3px; overflow: hidden;
              background: var(--ck-code-bg); }
.ck .gp-bar > span { display: block; height: 100%; }
.ck .gp-key { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
              margin: 0 3px 0 10px; vertical-align: -1px; }
</style>
"""


def of_snapshot(snap: RunSnapshot, now: float) -> goodput.RunGoodput:
    """The run's goodput now (a running attempt counts up to ``now``)."""
    return goodput.compute(snap.attempts, snap.times, now, run=snap.root, run_id=snap.run_id)


def _bar(wall: float, productive: float, causes: dict[str, float]) -> str:
    parts = {"productive": productive, **causes}
    spans = []
    for name, seconds in parts.items():
        if seconds <= 0 or wall <= 0:
            continue
        tip = f"{LABELS[name]}: {humanize.duration(seconds)} ({humanize.percent(seconds / wall)})"
        spans.append(
            f'<span class="gp-{name}" title="{esc(tip)}"'
            f' style="width:{min(100.0, 100 * seconds / wall):.3f}%;background:{COLORS[name]}">'
            "</span>"
        )
    return f'<div class="gp-bar">{"".join(spans)}</div>'


def _row(label: str, wall: float, productive: float, causes: dict[str, float], share: str) -> str:
    return (
        f'<div class="gp-row"><span>{label}</span>{_bar(wall, productive, causes)}'
        f"<b>{share}</b></div>"
    )


def render_badput(g: goodput.RunGoodput) -> str:
    """The bars' HTML: the run, then its newest attempts, then a colour key."""
    if not g.attempts:
        return ""
    worst = max(g.badput.to_dict().items(), key=lambda kv: kv[1])
    note = (
        f" · most lost to <b>{LABELS[worst[0]]}</b> ({humanize.duration(worst[1])})"
        if worst[1] > 0
        else ""
    )
    running = " <span class='muted'>(running: counted up to now)</span>" if g.running else ""
    rows = [
        f"<div class='gp-title'>goodput <b class='gp-run'>{humanize.percent(g.goodput)}</b>"
        f" of {humanize.duration(g.wall_s)}{note}{running}</div>",
        _row(
            "<b>run</b>", g.wall_s, g.productive_s, g.badput.to_dict(), humanize.percent(g.goodput)
        ),
    ]
    shown = g.attempts[-MAX_ATTEMPT_BARS:]
    if len(shown) < len(g.attempts):
        rows.append(f"<div class='muted'>{len(g.attempts) - len(shown)} older attempts</div>")
    for a in shown:
        label = f"attempt {a.attempt}"
        rows.append(
            _row(
                f"<span title='{esc(a.outcome)}'>{label}</span>",
                a.wall_s,
                a.productive_s,
                a.badput.to_dict(),
                humanize.percent(a.goodput),
            )
        )
    key = "".join(
        f'<span class="gp-key" style="background:{c}"></span>{LABELS[n]}' for n, c in COLORS.items()
    )
    return (
        f"{_CSS}<div class='ck gp'><h4>Where the time went</h4>{''.join(rows)}"
        f"<div class='muted' style='margin-top:4px'>{key}</div></div>"
    )


class BadputView(HtmlView):
    """Stacked bars of goodput and badput by cause, for the run and each attempt."""

    WATCH = ("run", "now")

    def html(self) -> str:
        snap = self.model.run
        return "" if snap is None else render_badput(of_snapshot(snap, self.model.now))
