"""What ``ckptdash status`` and ``ckptdash goodput`` print: one run in full
(:func:`render_status`), or one line per run of a folder (:func:`render_run_lines`), with SLURM's
view of each run's job (:func:`job_statuses`) and the run's health alerts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from ckptdash import control, humanize, schedulers
from ckptdash.analysis import run_words
from ckptdash.analysis.health import short_error
from ckptdash.analysis.run_words import logger_line
from ckptdash.cli import health as health_cli
from ckptdash.errors import CkptDashError, RunDirError
from ckptdash.ops import liveness
from ckptdash.resume import choose_resume
from ckptdash.rundir import RunDir, door, find_runs
from ckptdash.schedulers.base import JobStatus
from ckptdash.state import RunState
from ckptdash.state.checkpoints import checkpoint_order
from ckptdash.state.checkpoints import kind as checkpoint_kind
from ckptdash.state.records import SHOWN_STALE_AFTER_S, AttemptInfo, CheckpointInfo
from ckptdash.state.runset import RunSet
from ckptdash.terminal import one_line


def status_command(args: argparse.Namespace) -> int:
    """``ckptdash status PATH``: one run in full, or a line per run of a folder."""
    runs, states, broken = load_each(find_runs(args.path), args.path)
    if not runs:
        return _print_broken(broken, 2)
    views = [None] * len(states) if args.no_scheduler else job_statuses(states)
    if args.json:
        dicts = []
        now = time.time()
        for run, state, view in zip(runs, states, views, strict=True):
            d = state.to_dict()
            judge_into(d, run, state, now, resume=len(states) == 1)
            d["alerts"] = health_cli.alerts_of(run, state, args)
            d["untrusted"] = door.untrusted(run.root)
            if view is not None:
                d["scheduler"] = view.to_dict()
            dicts.append(d)
        out: Any = (
            dicts[0] if len(states) == 1 and runs[0].root == Path(args.path) else {"runs": dicts}
        )
        if broken:
            out["unreadable"] = [{"root": str(r.root), "error": why} for r, why in broken]
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(out), indent=2).decode() + "\n")
        return 0
    if len(runs) == 1 and runs[0].root == Path(args.path):
        gone = liveness.gone_here(states[0])
        print(render_status(runs[0], states[0], scheduler=views[0], gone=gone))
        for alert in health_cli.alerts_of(runs[0], states[0], args):
            print(one_line(f"ALERT {alert['kind']}: {alert['detail']}"))
    else:
        print(render_run_lines(runs, states))
        for run, state in zip(runs, states, strict=True):
            for alert in health_cli.alerts_of(run, state, args):
                print(one_line(f"ALERT {run.root.name} {alert['kind']}: {alert['detail']}"))
        print(f"\n{len(runs)} run(s); `ckptdash status {runs[0].root}` shows one in full")
    return _print_broken(broken, 0)


def load_each(
    runs: list[RunDir], path: str | Path
) -> tuple[list[RunDir], list[RunState], list[tuple[RunDir, str]]]:
    """The state of each run of a folder, read through one run set
    (:mod:`ckptdash.state.runset`); a run that cannot be read fails alone (its reason in the
    third list) and the others go on. A single run's error is raised."""
    each = RunSet(path, strict=True)
    each.join(runs)
    read = {run.rd.root: run.state for run in each.poll()}
    broken = [(run, each.broken[str(run.root)][1]) for run in runs if str(run.root) in each.broken]
    if broken and len(runs) == 1 and runs[0].root == Path(path):
        raise RunDirError(broken[0][1])
    good = [run for run in runs if run.root in read]
    return good, [read[run.root] for run in good], broken


def _print_broken(broken: list[tuple[RunDir, str]], rc: int) -> int:
    """Say once, on stderr, each run of the folder that could not be shown."""
    for run, why in broken:
        print(one_line(f"ckptdash: {run.root}: not shown: {why}"), file=sys.stderr)
    return rc


def run_word(
    state: RunState,
    now: float,
    stale_after_s: float = SHOWN_STALE_AFTER_S,
    gone: dict[int, str] | None = None,
) -> str:
    """The run's state in one word, as the dashboard's badge says it
    (:mod:`ckptdash.analysis.run_words`); ``lost`` for a running attempt whose process is
    ``gone`` from this host (:func:`ckptdash.ops.liveness.gone_here`)."""
    newest = _newest(state)
    if newest is not None and newest.outcome == "running" and gone and newest.attempt in gone:
        return "lost"
    return run_words.run_word(newest, state.requeues, state.signals, now, stale_after_s)


def judge_into(
    d: dict[str, Any], run: RunDir, state: RunState, now: float, *, resume: bool = True
) -> None:
    """Add to ``d`` (``state.to_dict()``) every judgement the text of ``ckptdash status``
    shows beyond the recorded state, in the fields docs/format.md documents: the run's word
    (``state``: ``lost``, ``stale``, …), each attempt's ``shown_outcome`` and ``lost`` line,
    each checkpoint's ``before_fresh_start``, and ``next_resume`` (with ``resume``: one run
    in full, as the text shows it; a folder's line per run has none, so neither has its JSON).

    Invariant: the text and the JSON are made from the same calls (:func:`run_word`,
    :func:`_outcome`, :func:`_history`, :func:`~ckptdash.resume.choose_resume`), so a script
    never reads ``running`` where a person reads ``lost``.
    """
    gone = liveness.gone_here(state, now=now)
    d["judged_at"] = now
    d["state"] = run_word(state, now, gone=gone)
    for n, a in state.attempts.items():
        entry = d["attempts"][str(n)]
        entry["shown_outcome"] = "lost" if a.outcome == "running" and n in gone else a.outcome
        entry["lost"] = gone.get(n)
    boundary = state.fresh_start()
    since = boundary.attempt if boundary is not None else -1
    for path, c in state.checkpoints.items():
        d["checkpoints"][path]["before_fresh_start"] = _history(c, since)
    if not resume:
        return
    choice = choose_resume(run, state=state)
    d["next_resume"] = {
        "path": choice.path,
        "reason": choice.reason,
        "skipped": [{"path": p, "reason": why} for p, why in choice.skipped],
    }


def _newest(state: RunState) -> AttemptInfo | None:
    return state.attempts[max(state.attempts)] if state.attempts else None


def render_run_lines(runs: list[RunDir], states: list[RunState], now: float | None = None) -> str:
    """One line per run, like ``squeue``: run, state, attempt, step / max, last event, and the
    newest checkpoint recorded as saved (its file is not re-read: a folder may hold 1,000 runs)."""
    now = time.time() if now is None else now
    rows = []
    for run, state in zip(runs, states, strict=True):
        newest = _newest(state)
        saved = [c for c in state.checkpoints.values() if c.status == "saved"]
        best = max(saved, key=lambda c: (c.step or 0, c.t or 0), default=None)
        step = "-"
        if newest is not None:
            done = newest.outcome == "finished"
            step = _opt(humanize.steps_done(newest.step, newest.max_steps, done))
        if newest is not None and newest.max_steps:
            step += f" / {newest.max_steps}"
        rows.append(
            [
                run.root.name,
                run_word(state, now, gone=liveness.gone_here(state, now=now))
                + (" (untrusted)" if door.untrusted(run.root) else ""),
                "-" if newest is None else str(newest.attempt),
                step,
                humanize.rough_age(None if newest is None else newest.last_heartbeat_t, now),
                "-" if best is None else f"{_rel(best.path, run.root)} (step {_opt(best.step)})",
            ]
        )
    header = ["RUN", "STATE", "ATTEMPT", "STEP / MAX", "LAST EVENT", "NEWEST SAVED CHECKPOINT"]
    return _table(header, rows)


def _rel(path: str, root: Path) -> str:
    """A recorded (absolute) path relative to the run directory when it lies inside it."""
    try:
        return str(Path(path).relative_to(root.resolve()))
    except ValueError:
        try:
            return str(Path(path).relative_to(root))
        except ValueError:
            return path


def _who(author: str, host: str) -> str:
    """``user@host`` once: a dashboard's author already names its host."""
    if "@" in author:
        return author
    return f"{author or '?'}@{host or '?'}"


def goodput_command(args: argparse.Namespace) -> int:
    """``ckptdash goodput PATH``: where the time of each run went."""
    from ckptdash.analysis.goodput import of_state, render

    runs, states, broken = load_each(find_runs(args.path), args.path)
    if not runs:
        return _print_broken(broken, 2)
    now = time.time()
    results = [of_state(state, now) for state in states]
    if args.json:
        dicts = [g.to_dict() for g in results]
        single = len(runs) == 1 and runs[0].root == Path(args.path)
        out: Any = dicts[0] if single else {"runs": dicts}
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(out), indent=2).decode() + "\n")
        return _print_broken(broken, 0)
    print("\n\n".join(render(g) for g in results))
    return _print_broken(broken, 0)


def job_statuses(states: list[RunState]) -> list[JobStatus | None]:
    """The scheduler's view of each run's job for ``status`` (None for a run with no job of a
    scheduler ckptdash can ask).

    Once a scheduler cannot be asked at all it is not asked again for the other runs: an
    unreachable controller costs one wait.
    """
    out: list[JobStatus | None] = []
    unavailable: dict[str, str] = {}
    for state in states:
        found = schedulers.job_of(state.attempts.values())
        queue = None if found is None else schedulers.queue_for(found[0])
        if found is None or queue is None:
            out.append(None)
        elif found[0] in unavailable:
            out.append(queue.unavailable_status(found[1], unavailable[found[0]]))
        else:
            status = queue.job_status(found[1])
            if status.unavailable:
                unavailable[found[0]] = status.unavailable
            out.append(status)
    return out


def render_status(
    run: RunDir,
    state: RunState,
    now: float | None = None,
    scheduler: JobStatus | None = None,
    gone: dict[int, str] | None = None,
) -> str:
    """A readable summary of one run: attempts, checkpoints, signals, requeues, commands.

    ``gone`` (:func:`ckptdash.ops.liveness.gone_here`) shows those running attempts as lost.

    ``scheduler`` (from :func:`job_statuses`) adds the scheduler's view of the job under the header.
    Every line holds one line: a newline inside a recorded value is printed as an escape.
    """
    return "\n".join(
        [
            *map(one_line, _header_lines(run, state, scheduler)),
            "",
            _attempts_table(state, gone or {}),
            "",
            _checkpoints_table(run, state),
            *map(one_line, _event_lines(state)),
        ]
    )


def _header_lines(run: RunDir, state: RunState, scheduler: JobStatus | None) -> list[str]:
    """The run, its requeue setting and pin, the scheduler's view, and what the next attempt
    resumes."""
    lines = [f"run {state.run_id}  {run.root}"]
    why = door.untrusted(run.root)
    if why:
        lines.append(f"UNTRUSTED: {why}; what it records may have been written by others")
    try:
        settings = control.read_settings(run)
        requeue = "suspended" if settings.requeue_suspended else "auto"
        pin = _rel(settings.resume_pin, run.root) if settings.resume_pin else "-"
        if settings.resume_pin:
            pin += " (sticky)" if settings.resume_pin_sticky else " (used once)"
        if settings.fresh_start:
            pin += "   fresh start requested (`ckptdash resume RUN --clear` cancels it)"
    except CkptDashError as exc:
        requeue, pin = f"unknown ({exc})", "-"
    choice = choose_resume(run, state=state)
    lines.append(f"requeue: {requeue}   resume pin: {pin}")
    if scheduler is not None:
        lines.append(scheduler.describe())
    target = _rel(choice.path, run.root) if choice.path else "fresh start"
    lines.append(f"next resume: {target}  ({choice.reason})")
    return lines


def _outcome(a: AttemptInfo, gone: dict[int, str]) -> str:
    """The attempt's outcome with a short reason: a failure's error is cut to one short line
    (``ckptdash status RUN --json`` and the dashboard have all of it)."""
    if a.outcome == "running" and a.attempt in gone:
        return f"lost (process {a.pid} gone)"
    reason = short_error(a.end_reason, 60) if a.outcome == "failed" else a.end_reason
    return a.outcome + (f" ({reason})" if reason else "")


def _attempts_table(state: RunState, gone: dict[int, str]) -> str:
    return _table(
        ["attempt", "host", "job", "started", "outcome", "step", "resumed from"],
        [
            [
                str(a.attempt),
                a.host,
                a.job_id or "-",
                humanize.clock(a.started_at, "-"),
                _outcome(a, gone),
                _opt(a.step),
                Path(a.resumed_from).name if a.resumed_from else "-",
            ]
            for a in sorted(state.attempts.values(), key=lambda a: a.attempt)
        ],
    )


def _checkpoints_table(run: RunDir, state: RunState) -> str:
    ckpts = sorted(state.checkpoints.values(), key=checkpoint_order)
    if not ckpts:
        return "no checkpoints recorded"
    boundary = state.fresh_start()
    since = boundary.attempt if boundary is not None else -1
    return _table(
        ["step", "trigger", "kind", "status", "size", "save s", "attempt", "path"],
        [
            [
                _opt(c.step),
                c.trigger,
                checkpoint_kind(c, state.checkpoints),
                c.status
                + (" (unvalidated)" if c.unvalidated else "")
                + (" (before fresh start)" if _history(c, since) else ""),
                "-" if c.unvalidated else humanize.size(c.size_bytes, "-"),
                "-" if c.duration_s is None else f"{c.duration_s:.2f}",
                _opt(c.attempt),
                _rel(c.path, run.root) + (f"  (saved x{c.replaced + 1})" if c.replaced else ""),
            ]
            for c in ckpts
        ],
    )


def _history(c: CheckpointInfo, fresh_since: int) -> bool:
    """A saved checkpoint from before the fresh-start boundary: never a resume candidate."""
    return c.status == "saved" and c.attempt is not None and c.attempt < fresh_since


def _event_lines(state: RunState) -> list[str]:
    """A line per signal, requeue, anomaly, logger run and command; then the count of
    unreadable lines."""
    lines = [
        f"signal  {s.signal} ({s.action}) attempt {s.attempt} rank {s.rank} step {_opt(s.step)}"
        for s in state.signals
    ]
    for r in state.requeues:
        what = f"issued: {r.command}" if r.issued else f"skipped: {r.reason}"
        lines.append(f"requeue attempt {r.attempt} {what}")
    for an in state.anomalies:
        pinned = f", pinned {an.pinned}" if an.pinned else ""
        lines.append(
            f"anomaly attempt {an.attempt} step {_opt(an.step)}: {an.reason} ({an.action}{pinned})"
        )
    lines += [f"logger  {logger_line(info)}" for _, info in sorted(state.loggers.items())]
    for c in sorted(state.commands.values(), key=lambda c: (c.issued_at or 0, c.id)):
        extra = c.detail or c.reason or c.error
        lines.append(
            f"command {c.command or '?'} {humanize.short_id(c.id)} by"
            f" {_who(c.author, c.host)}{c.spoof_note}:"
            f" {c.status}" + (f" ({extra})" if extra else "")
        )
    bad = sum(state.bad_lines.counts.values())
    if bad:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(state.bad_lines.counts.items()))
        lines.append(f"skipped {bad} unreadable event line(s): {counts}")
    return lines


def _table(header: list[str], rows: list[list[str]]) -> str:
    rows = [[one_line(cell) for cell in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    row = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(row.format(*r).rstrip() for r in [header, *rows])


def _opt(value: object) -> str:
    return "-" if value is None else str(value)
