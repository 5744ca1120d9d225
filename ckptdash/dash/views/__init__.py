"""The read-only views: status header, run list, goodput and command list.

Each view takes the session's :class:`~ckptdash.dash.model.DashModel`, makes
its own widgets, and re-renders when the model's parameters change — which
happens in the watcher thread, so a notebook widget stays live while a cell
blocks. Nothing here touches a file.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

import pandas as pd
import panel as pn
from bokeh.models.widgets.tables import NumberFormatter

from ckptdash import humanize as fmt
from ckptdash.analysis import goodput as badput
from ckptdash.analysis import preemption
from ckptdash.analysis.run_words import logger_line
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.model import DashModel, rates, run_status
from ckptdash.dash.views import text
from ckptdash.dash.views.frames import NUMBER, TEXT, typed_frame
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.widgets import HtmlPane, HtmlView, ReadOnlyTabulator

STATUS_COLORS: Final = {
    "waiting": "#6c757d",
    "running": "#2f9e44",
    "stale": "#e8590c",
    "preempted": "#f08c00",
    "terminated": "#f08c00",
    "lost": "#e8590c",
    "requeue pending": "#1971c2",
    "stopped": "#495057",
    "finished": "#2b8a3e",
    "failed": "#c92a2a",
}


def badge(status: str) -> str:
    color = STATUS_COLORS.get(status, "#495057")
    return f'<span class="badge" style="background:{color}">{esc(status)}</span>'


class StatusHeader(HtmlView):
    """State, job, attempt, host, step and progress, speed, ETA, time left, requeue, resume."""

    WATCH = ("run", "now", "loaded", "problem", "stale_after_s")

    def html(self) -> str:
        return render_header(self.model)


def render_header(model: DashModel) -> str:
    """The header's HTML for the model's selected run."""
    if model.problem:
        return f'<div class="ck"><span class="problem">{esc(model.problem)}</span></div>'
    if not model.loaded:
        return f'<div class="ck muted">reading {esc(model.path)} …</div>'
    snap: RunSnapshot | None = model.run
    if snap is None:
        return f'<div class="ck muted">{esc(waiting_line(model.path))}</div>'
    now = model.now
    status, why = run_status(snap, now, model.stale_after_s)
    r = rates(snap, now)
    a = snap.newest
    cells: list[tuple[str, str]] = []
    if a is not None:
        job = f"{esc(a.scheduler or '?')} {esc(a.job_id or '')}".strip()
        budget = f" <span class='muted'>({a.attempt + 1} of {a.requeue_budget})</span>"
        cells += [
            ("scheduler · job", job),
            ("attempt", f"{a.attempt}{budget if a.requeue_budget else ''}"),
            ("host", esc(a.host or fmt.DASH)),
        ]
    step = fmt.number(r.step)
    if r.max_steps:
        step += f" <span class='muted'>/ {fmt.number(r.max_steps)}</span>"
    cells += [
        ("step", step),
        ("epoch", fmt.number(r.epoch)),
        ("steps/s", fmt.number(r.steps_per_s)),
        ("ETA", fmt.duration(r.eta_s)),
        ("time left (limit)", fmt.duration(r.time_left_s)),
        ("last event", fmt.age(snap.last_seen, now)),
    ]
    settings = snap.settings
    if settings is None:
        requeue = f"<span class='problem'>unknown</span> {esc(snap.settings_error)}"
    elif settings.requeue_suspended:
        who = f" by {esc(settings.updated_by)}" if settings.updated_by else ""
        requeue = f"<b style='color:#e8590c'>suspended</b><span class='muted'>{who}</span>"
    else:
        requeue = "<b>on</b>"
    cells.append(("auto-requeue", requeue))
    grid = "".join(f"<div><label>{k}</label><b>{v}</b></div>" for k, v in cells)
    bar = ""
    if r.fraction is not None:
        bar = (
            f'<div class="bar" title="{r.fraction:.1%}">'
            f'<div style="width:{r.fraction:.2%}"></div></div>'
        )
    choice = snap.resume
    if choice is None:
        resume = ""
    else:
        target = text.path_html(choice.path, snap.root) if choice.path else "<b>fresh start</b>"
        pin = settings.resume_pin if settings is not None else None
        sticky = settings is not None and settings.resume_pin_sticky
        pinned = ""
        if pin and pin == choice.path:
            pinned = " <b>(pinned, sticky)</b>" if sticky else " <b>(pinned, used once)</b>"
        resume = (
            f"<div style='margin-top:6px'>next attempt resumes from {target}{pinned}"
            f" <span class='muted'>— {esc(choice.reason)}</span></div>"
        )
    if snap.loggers:  # which TensorBoard folder / W&B run / ... holds this run's curves
        resume += "".join(
            f"<div class='muted' style='margin-top:2px'>curves: {esc(logger_line(info))}</div>"
            for info in snap.loggers
        )
    bad = sum(snap.bad_lines.values())
    tail = f"{fmt.number(snap.events_total)} events"
    if bad:
        tail += f", <span class='problem'>{bad} unreadable line(s) skipped</span>"
    return (
        f'<div class="ck"><div><span class="title">{esc(snap.name)}</span>{badge(status)}'
        f'<span class="why">{esc(why)}</span></div>'
        f'<div class="grid">{grid}</div>{bar}{resume}'
        f'<div class="muted" style="margin-top:4px">{tail} · run {esc(snap.run_id)}'
        f" · {esc(snap.root)}</div></div>"
    )


def waiting_line(path: str) -> str:
    """What the header says while the path holds no run yet (the training will create it)."""
    return f"waiting for the first event in {path}"


class RunList(pn.viewable.Viewer):  # type: ignore[misc]
    """The runs of a folder: status, attempt, step, last event; selecting one shows it."""

    SCHEMA: Final = {
        "run": TEXT,
        "status": TEXT,
        "attempt": NUMBER,
        "step": NUMBER,
        "last event": TEXT,
        "events": NUMBER,
        "goodput": NUMBER,
    }

    def __init__(self, model: DashModel, **params: Any) -> None:
        super().__init__(**params)
        self.model = model
        self._roots: list[str] = []
        self._table = ReadOnlyTabulator(
            typed_frame([], self.SCHEMA),
            show_index=False,
            selectable=1,
            disabled=True,
            height=180,
            sizing_mode="stretch_width",
            layout="fit_data_stretch",
            # Explicit: the defaults would come from the empty first frame (see table.py).
            formatters={
                "attempt": NumberFormatter(format="0", nan_format="–"),
                "step": NumberFormatter(format="0,0", nan_format="–"),
                "events": NumberFormatter(format="0,0", nan_format="–"),
                "goodput": NumberFormatter(format="0.0%", nan_format="–"),
            },
            text_align={"attempt": "right", "step": "right", "events": "right", "goodput": "right"},
        )
        self._heading = HtmlPane(margin=(0, 10))
        self._layout = pn.Column(
            self._heading,
            self._table,
            visible=False,
            sizing_mode="stretch_width",
        )
        self._table.param.watch(self._on_select, "selection")
        model.param.watch(self._render, ["runs", "now", "is_folder", "selected"])
        self._render()

    def __panel__(self) -> Any:
        return self._layout

    def frame(self) -> pd.DataFrame:
        """The table's rows for the model's runs now."""
        now, stale = self.model.now, self.model.stale_after_s
        rows = []
        for r in self.model.runs:
            newest = r.newest
            rows.append(
                {
                    "run": r.name,
                    "status": run_status(r, now, stale)[0],
                    "attempt": None if newest is None else newest.attempt,
                    "step": None if newest is None else newest.step,
                    "last event": fmt.age(r.last_seen, now),
                    "events": r.events_total,
                    "goodput": _goodput_of(r, now),
                }
            )
        return typed_frame(rows, self.SCHEMA)

    def _render(self, *events: object) -> None:
        self._layout.visible = self.model.is_folder
        if not self.model.is_folder:
            return
        df = self.frame()
        self._heading.object = f"<div class='ck'><h4>Runs ({len(df)})</h4></div>"
        roots = [r.root for r in self.model.runs]
        if roots != self._roots or not df.equals(self._table.value):
            self._roots = roots
            self._table.value = df
        if self.model.selected in roots:
            wanted = [roots.index(self.model.selected)]
            if self._table.selection != wanted:
                self._table.selection = wanted

    def _on_select(self, event: Any) -> None:
        # Browser input: map the row to a run we listed; anything else is ignored.
        if len(event.new) == 1 and 0 <= event.new[0] < len(self._roots):
            with contextlib.suppress(ValueError):
                self.model.select(self._roots[event.new[0]])


def _goodput_of(snap: RunSnapshot, now: float) -> float | None:
    # The same numbers as `ckptdash goodput`.
    return badput.compute(snap.attempts, snap.times, now).goodput


class GoodputView(HtmlView):
    """Work lost per preemption, saving share, preemption rate, Young/Daly interval."""

    def html(self) -> str:
        snap = self.model.run
        return "" if snap is None else render_goodput(preemption.compute(snap))


def render_goodput(g: preemption.PreemptionCost) -> str:
    """The goodput panel's HTML."""
    d = fmt.duration
    lines = [
        "<h4>Goodput</h4>",
        f"<div>saving: <b>{fmt.percent(g.saving_share)}</b> of {d(g.wall_s)} wall time"
        f" <span class='muted'>({g.saves} saves, {d(g.saving_s)})</span></div>",
    ]
    n = len(g.preemptions)
    rate = f"{g.per_hour:.2f} /h" if g.per_hour is not None else fmt.DASH
    unwarned = f", {g.unwarned} without a signal" if g.unwarned else ""
    lines.append(
        f"<div>preemptions: <b>{n}</b> <span class='muted'>({rate}{unwarned})</span>"
        f" · work lost: <b>{d(g.lost_s) if n else fmt.DASH}</b></div>"
    )
    if g.young_s is not None:
        interval = d(g.interval_s) if g.interval_s is not None else "no periodic saves"
        lines.append(
            f"<div>checkpoint interval: this run <b>{interval}</b> · Young"
            f" <b>{d(g.young_s)}</b> · Daly <b>{d(g.daly_s)}</b>"
            f" <span class='muted'>(save cost {d(g.save_cost_s)}, MTBF {d(g.mtbf_s)})</span></div>"
        )
        now_w, best_w = g.waste(g.interval_s), g.waste(g.daly_s)
        if now_w is not None and best_w is not None:
            lines.append(
                f"<div class='muted'>expected time lost to saving and re-done work:"
                f" {fmt.percent(now_w)} now, {fmt.percent(best_w)} at the Daly interval</div>"
            )
        if best_w is not None:
            now_g = fmt.percent(max(0.0, 1 - now_w)) if now_w is not None else fmt.DASH
            lines.append(
                f"<div class='gp-advice'>expected goodput at the Daly interval:"
                f" <b>{fmt.percent(max(0.0, 1 - best_w))}</b>"
                f" <span class='muted'>(at this run's interval {now_g}; startup and queue"
                " time not included)</span></div>"
            )
    else:
        lines.append(
            "<div class='muted'>optimal interval (Young/Daly): needs at least one preemption"
            " and one timed save</div>"
        )
    if g.preemptions:
        rows = "".join(_preemption_row(p) for p in g.preemptions[-8:])
        lines.append(
            "<table><tr><th>attempt</th><th>signal</th><th>signal → durable</th>"
            f"<th>durable → requeue</th><th>work lost</th></tr>{rows}</table>"
        )
    return '<div class="ck">' + "".join(lines) + "</div>"


def _preemption_row(p: preemption.Preemption) -> str:
    d = fmt.duration
    requeue = "" if p.requeue_t is None else (" issued" if p.requeue_issued else " refused")
    steps = "" if p.lost_steps is None else f" ({p.lost_steps} steps)"
    return (
        f"<tr><td>{p.attempt}</td><td>{esc(p.signal or 'no signal')}</td>"
        f"<td>{d(p.signal_to_save_s)}</td><td>{d(p.save_to_requeue_s)}{requeue}</td>"
        f"<td>{d(p.lost_s)}{steps}</td></tr>"
    )


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
            f"<tr><td>{fmt.clock(c.issued_at or c.received_at)}</td>"
            f"<td>{esc(c.command or '?')}</td><td>{esc((c.author or '?') + c.spoof_note)}</td>"
            f"<td class='st st-{esc(c.status)}'>{esc(c.status)}</td>"
            f"<td>{shown}</td></tr>"
        )
    return (
        "<div class='ck'><h4>Commands</h4><table><tr><th>issued</th><th>command</th>"
        "<th>by</th><th>status</th><th>answer</th></tr>" + "".join(rows) + "</table></div>"
    )
