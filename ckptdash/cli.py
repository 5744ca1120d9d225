"""``ckptdash`` on the command line: status, the controls, the demo.

    ckptdash status RUN_DIR [--json]        the run state (a folder of runs works too)
    ckptdash save RUN_DIR                    Save now (a command to the running job)
    ckptdash stop RUN_DIR --yes              Stop after save
    ckptdash requeue RUN_DIR --suspend|--resume
    ckptdash resume RUN_DIR [--pin PATH|--clear]
    ckptdash demo                            a small real run with a preemption

Every user error is one line on stderr saying what is wrong and how to fix it,
and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from ckptdash import control
from ckptdash.errors import CkptDashError
from ckptdash.resume import choose_resume, load_state
from ckptdash.rundir import RunDir, find_runs
from ckptdash.state import RunState

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ckptdash`` command; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except CkptDashError as exc:
        print(f"ckptdash: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PermissionError as exc:
        print(
            f"ckptdash: {exc.filename}: permission denied; run as a user who can read"
            " (and, for controls, write) the run directory",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"ckptdash: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ckptdash",
        description="See and steer checkpoints, preemption signals and requeues of training runs.",
    )
    sub = p.add_subparsers(metavar="COMMAND")

    s = sub.add_parser("status", help="print the state of a run (or of every run in a folder)")
    s.add_argument("path", help="a run directory, or a folder of run directories")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_status)

    s = sub.add_parser("save", help="ask the running job to save a checkpoint now")
    s.add_argument("run_dir")
    s.add_argument("--ttl", type=float, default=600.0, help="expire after this many seconds")
    s.set_defaults(func=_issue, command="save_now")

    s = sub.add_parser("stop", help="ask the running job to save, then stop without requeue")
    s.add_argument("run_dir")
    s.add_argument("--ttl", type=float, default=600.0, help="expire after this many seconds")
    s.add_argument("--yes", action="store_true", help="confirm: this ends the training job")
    s.set_defaults(func=_issue, command="stop_after_save")

    s = sub.add_parser("requeue", help="suspend or resume automatic requeue after preemption")
    s.add_argument("run_dir")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--suspend", action="store_true", help="save on preemption but do not requeue")
    g.add_argument("--resume", action="store_true", help="requeue after preemption again")
    s.set_defaults(func=_requeue)

    s = sub.add_parser("resume", help="show or pin the checkpoint the next attempt resumes from")
    s.add_argument("run_dir")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--pin", metavar="PATH", help="a checkpoint this run recorded")
    g.add_argument("--clear", action="store_true", help="remove the pin (back to the rule)")
    s.set_defaults(func=_resume)

    s = sub.add_parser("demo", help="run a small real training with a preemption and a resume")
    s.add_argument(
        "--run-dir", default="runs/demo", help="where the demo writes (default %(default)s)"
    )
    s.add_argument("--steps", type=int, default=300, help="training steps (default %(default)s)")
    s.add_argument(
        "--preempt-every", type=float, default=8.0, help="seconds between preemptions (%(default)s)"
    )
    s.add_argument("--max-preemptions", type=int, default=2, help="default %(default)s")
    s.set_defaults(func=_demo)
    return p


# --- status --------------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    runs = find_runs(args.path)
    states = [load_state(run) for run in runs]
    if args.json:
        out: Any = (
            states[0].to_dict()
            if len(states) == 1 and runs[0].root == Path(args.path)
            else {"runs": [s.to_dict() for s in states]}
        )
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(out), indent=2).decode() + "\n")
        return 0
    for i, (run, state) in enumerate(zip(runs, states, strict=True)):
        if i:
            print()
        print(render_status(run, state))
    return 0


def render_status(run: RunDir, state: RunState, now: float | None = None) -> str:
    """A readable summary of one run: attempts, checkpoints, signals, requeues, commands."""
    now = time.time() if now is None else now
    lines = [f"run {state.run_id}  {run.root}"]
    try:
        settings = control.read_settings(run)
        requeue = "suspended" if settings.requeue_suspended else "auto"
        pin = settings.resume_pin or "-"
    except CkptDashError as exc:
        requeue, pin = f"unknown ({exc})", "-"
    choice = choose_resume(run, state=state)
    lines.append(f"requeue: {requeue}   resume pin: {pin}")
    lines.append(f"next resume: {choice.path or 'fresh start'}  ({choice.reason})")
    lines.append("")
    lines.append(
        _table(
            ["attempt", "host", "job", "started", "outcome", "step", "resumed from"],
            [
                [
                    str(a.attempt),
                    a.host,
                    a.job_id or "-",
                    _ago(a.started_at, now),
                    a.outcome + (f" ({a.end_reason})" if a.end_reason else ""),
                    _opt(a.step),
                    Path(a.resumed_from).name if a.resumed_from else "-",
                ]
                for a in sorted(state.attempts.values(), key=lambda a: a.attempt)
            ],
        )
    )
    lines.append("")
    ckpts = sorted(state.checkpoints.values(), key=lambda c: (c.step or 0, c.t or 0))
    lines.append(
        _table(
            ["step", "trigger", "status", "size", "save s", "attempt", "path"],
            [
                [
                    _opt(c.step),
                    c.trigger,
                    c.status,
                    _size(c.size_bytes),
                    "-" if c.duration_s is None else f"{c.duration_s:.2f}",
                    _opt(c.attempt),
                    c.path,
                ]
                for c in ckpts
            ],
        )
        if ckpts
        else "no checkpoints recorded"
    )
    for s in state.signals:
        lines.append(
            f"signal  {s.signal} ({s.action}) attempt {s.attempt} rank {s.rank} step {_opt(s.step)}"
        )
    for r in state.requeues:
        what = f"issued: {r.command}" if r.issued else f"skipped: {r.reason}"
        lines.append(f"requeue attempt {r.attempt} {what}")
    for c in sorted(state.commands.values(), key=lambda c: c.issued_at or 0):
        extra = c.detail or c.reason or c.error
        lines.append(
            f"command {c.command or '?'} {c.id} by {c.author or '?'}@{c.host or '?'}: {c.status}"
            + (f" ({extra})" if extra else "")
        )
    bad = sum(state.bad_lines.counts.values())
    if bad:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(state.bad_lines.counts.items()))
        lines.append(f"skipped {bad} unreadable event line(s): {counts}")
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), *(fmt.format(*r) for r in rows)])


def _opt(value: object) -> str:
    return "-" if value is None else str(value)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return str(n)


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# --- controls ----------------------------------------------------------------------------------


def _author() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _require_run(path: str) -> RunDir:
    (run,) = find_runs(path)[:1]
    if run.root != Path(path):
        raise CkptDashError(f"{path}: a folder of runs; pass one run directory, e.g. {run.root}")
    return run


def _issue(args: argparse.Namespace) -> int:
    run = _require_run(args.run_dir)
    if args.command == "stop_after_save" and not args.yes:
        raise CkptDashError(
            f"{run.root}: stop ends the training job after one more save; add --yes to confirm"
        )
    cmd = control.issue(run, args.command, ttl_s=args.ttl)
    print(
        f"{cmd.NAME} {cmd.id} queued in {run.inbox}; `ckptdash status {run.root}` shows the answer"
    )
    return 0


def _requeue(args: argparse.Namespace) -> int:
    run = _require_run(args.run_dir)
    if args.suspend or args.resume:
        control.update_settings(run, requeue_suspended=bool(args.suspend), author=_author())
    settings = control.read_settings(run)
    print(f"auto-requeue: {'suspended' if settings.requeue_suspended else 'on'} ({run.settings})")
    return 0


def _resume(args: argparse.Namespace) -> int:
    run = _require_run(args.run_dir)
    state = load_state(run)
    if args.pin:
        recorded = {c.path for c in state.valid_checkpoints()}
        wanted = str(Path(args.pin).resolve())
        match = next(
            (p for p in recorded if p == args.pin or str(Path(p).resolve()) == wanted), None
        )
        if match is None:
            raise CkptDashError(
                f"{args.pin}: not a checkpoint this run recorded; pick a path from"
                f" `ckptdash status {run.root}` (pins are limited to recorded checkpoints)"
            )
        control.update_settings(run, resume_pin=match, author=_author())
    elif args.clear:
        control.update_settings(run, resume_pin=None, author=_author())
    choice = choose_resume(run, state=state)
    print(f"next attempt resumes from: {choice.path or 'nothing (fresh start)'}")
    print(f"because: {choice.reason}")
    for path, reason in choice.skipped:
        print(f"skipped {path}: {reason}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ckptdash.demo import run_demo

    return run_demo(
        Path(args.run_dir),
        steps=args.steps,
        preempt_every_s=args.preempt_every,
        max_preemptions=args.max_preemptions,
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
