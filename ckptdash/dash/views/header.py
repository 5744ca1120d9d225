"""The status header: state, job, attempt, host, step, speed, ETA, requeue and resume."""

from __future__ import annotations

from typing import Final

from ckptdash import humanize
from ckptdash.analysis.run_words import logger_line
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.model import DashModel, rates, run_status
from ckptdash.dash.views import text
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.widgets import HtmlView

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
            ("host", esc(a.host or humanize.DASH)),
        ]
    step = humanize.number(r.step)
    if r.max_steps:
        step += f" <span class='muted'>/ {humanize.number(r.max_steps)}</span>"
    cells += [
        ("step", step),
        ("epoch", humanize.number(r.epoch)),
        ("steps/s", humanize.number(r.steps_per_s)),
        ("ETA", humanize.duration(r.eta_s)),
        ("time left (limit)", humanize.duration(r.time_left_s)),
        ("last event", humanize.age(snap.last_seen, now)),
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
    if snap.untrusted:  # others may have written what it shows: nothing is acted on from it
        resume += (
            f"<div class='problem' style='margin-top:2px'>untrusted: {esc(snap.untrusted)}</div>"
        )
    bad = sum(snap.bad_lines.values())
    tail = f"{humanize.number(snap.events_total)} events"
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
