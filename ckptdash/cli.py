"""``ckptdash`` on the command line: status, the controls, the demo.

    ckptdash status RUN_DIR [--json]        the run state in full
    ckptdash status FOLDER                   one line per run, like squeue
    ckptdash goodput RUN_DIR [--json]       where the time went: goodput, badput by cause
    ckptdash save RUN_DIR                    Save now (a command to the running job)
    ckptdash stop RUN_DIR --yes              Stop after save
    ckptdash requeue RUN_DIR --suspend|--resume   (mirrored onto the SLURM job when SLURM is here)
    ckptdash requeue RUN_DIR --hold|--release|--cancel-pending --yes   (a requeued, pending job)
    ckptdash resume RUN_DIR [--pin PATH|--clear]
    ckptdash demo                            a small real run: preemptions, a kill, resumes
    ckptdash serve PATH [--port N]           the live dashboard in a browser tab
    ckptdash watch PATH [--on hung=requeue]  raise health alerts, notify, act (docs/health.md)
    ckptdash health RUN_DIR [--set K=V]      alerts and health thresholds of a run

Every user error is one line on stderr saying what is wrong and how to fix it,
and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from ckptdash import __version__, control, fmt, health_cli, slurm_admin
from ckptdash.demo import DEFAULT_STEPS
from ckptdash.errors import CkptDashError
from ckptdash.records import AttemptInfo
from ckptdash.resume import choose_resume, find_recorded, load_state
from ckptdash.rundir import RunDir, find_runs
from ckptdash.state import RunState
from ckptdash.terminal import printable_output

EXIT_USAGE = 2

STALE_AFTER_S = 120.0
"""A running attempt silent for this long is shown as stale (as the dashboard's default)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ckptdash`` command; returns the exit status."""
    # Event text from the run directory is printed below: one filter keeps terminal control
    # characters in it from reaching the terminal (see ckptdash/terminal.py).
    with printable_output():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
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
    except BrokenPipeError:
        # `ckptdash status RUN | head` closed the pipe: nothing went wrong for the user.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
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


_NO_QUEUE = "refuse when no attempt is running (by default the command waits for the next one)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ckptdash",
        description="See and steer checkpoints, preemption signals and requeues of training runs.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(metavar="COMMAND")

    s = sub.add_parser(
        "status", help="print the state of a run in full, or one line per run of a folder"
    )
    s.add_argument(
        "path", help="a run directory (in full), or a folder of run directories (a line each)"
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument(
        "--no-scheduler",
        action="store_true",
        help="do not ask SLURM for its view of the run's job (scontrol show job)",
    )
    health_cli.add_threshold_options(s)
    s.set_defaults(func=_status)

    s = sub.add_parser(
        "goodput", help="where a run's time went: goodput and badput by cause (docs/goodput.md)"
    )
    s.add_argument("path", help="a run directory, or a folder of run directories")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_goodput)

    s = sub.add_parser("save", help="ask the running job to save a checkpoint now")
    s.add_argument("run_dir")
    s.add_argument("--ttl", type=float, default=600.0, help="expire after this many seconds")
    s.add_argument("--no-queue", action="store_true", help=_NO_QUEUE)
    s.set_defaults(func=_issue, command="save_now")

    s = sub.add_parser("stop", help="ask the running job to save, then stop without requeue")
    s.add_argument("run_dir")
    s.add_argument("--ttl", type=float, default=600.0, help="expire after this many seconds")
    s.add_argument("--yes", action="store_true", help="confirm: this ends the training job")
    s.add_argument("--no-queue", action="store_true", help=_NO_QUEUE)
    s.set_defaults(func=_issue, command="stop_after_save")

    s = sub.add_parser(
        "requeue",
        help="suspend or resume automatic requeue; hold, release or cancel a requeued job",
    )
    s.add_argument("run_dir")
    g = s.add_mutually_exclusive_group()
    g.add_argument(
        "--suspend",
        action="store_true",
        help="save on preemption but do not requeue (also sets Requeue=0 on the SLURM job)",
    )
    g.add_argument(
        "--resume", action="store_true", help="requeue after preemption again (Requeue=1)"
    )
    g.add_argument(
        "--hold", action="store_true", help="keep the requeued, pending job from starting"
    )
    g.add_argument("--release", action="store_true", help="let a held job start again")
    g.add_argument(
        "--cancel-pending",
        action="store_true",
        help="cancel the requeued job while it waits in the queue (needs --yes)",
    )
    s.add_argument("--yes", action="store_true", help="confirm --cancel-pending")
    s.add_argument(
        "--job",
        metavar="JOBID",
        help="the SLURM job (default: the job of the run's latest attempt)",
    )
    s.set_defaults(func=_requeue)

    s = sub.add_parser("resume", help="show or pin the checkpoint the next attempt resumes from")
    s.add_argument("run_dir")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--pin", metavar="PATH", help="a checkpoint this run recorded")
    g.add_argument("--clear", action="store_true", help="remove the pin (back to the rule)")
    s.set_defaults(func=_resume)

    s = sub.add_parser(
        "demo", help="run a small real training: two preemptions, a kill, resumes (~1 min)"
    )
    s.add_argument(
        "--run-dir", default="runs/demo", help="where the demo writes (default %(default)s)"
    )
    s.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, help="training steps (default %(default)s)"
    )
    s.add_argument(
        "--preempt-every",
        type=float,
        default=10.0,
        help="seconds of training before each preemption or kill (%(default)s)",
    )
    s.add_argument(
        "--max-preemptions", type=int, default=2, help="SIGUSR2 preemptions (%(default)s)"
    )
    s.add_argument(
        "--kills",
        type=int,
        default=1,
        help="then kill this many attempts without warning (SIGKILL) (%(default)s)",
    )
    s.add_argument(
        "--port",
        type=int,
        default=5006,
        help="serve the live dashboard on 127.0.0.1:PORT while it runs; 0 picks a free port"
        " (%(default)s)",
    )
    s.add_argument("--no-serve", action="store_true", help="do not serve the dashboard")
    s.add_argument(
        "--exit-when-done",
        action="store_true",
        help="end when the training ends (by default the dashboard stays up until Ctrl-C)",
    )
    s.set_defaults(func=_demo)

    s = sub.add_parser("serve", help="serve the live dashboard (a run or a folder of runs)")
    s.add_argument("path", help="a run directory, or a folder of run directories")
    s.add_argument("--port", type=int, default=5006, help="0 picks a free port (%(default)s)")
    s.add_argument("--address", default="127.0.0.1", help="listen address (%(default)s)")
    s.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --address (anyone reaching it can try: add TLS)",
    )
    s.add_argument(
        "--basic-auth",
        metavar="FILE",
        help="also ask for a password (Panel's login page), read from FILE (chmod 600): one"
        ' password, or {"user": "password", ...}; or set $CKPTDASH_BASIC_AUTH',
    )
    s.add_argument(
        "--token-file",
        metavar="FILE",
        help="the URL's token, from FILE (chmod 600) or $CKPTDASH_TOKEN (default: a new random"
        " token at each start)",
    )
    s.add_argument(
        "--no-auth",
        action="store_true",
        help="ask no token (every user who reaches the port can stop the job; warns at start)",
    )
    s.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another Host name the browser uses (a proxy); others get 403 (repeatable)",
    )
    s.add_argument("--certfile", metavar="PEM", help="serve https: the TLS certificate")
    s.add_argument("--keyfile", metavar="PEM", help="serve https: the certificate's private key")
    s.add_argument(
        "--origin", action="append", default=[], metavar="HOST:PORT", help="more page origins"
    )
    s.add_argument("--poll", action="store_true", help="poll instead of inotify (NFS, Lustre)")
    s.add_argument("--inotify", action="store_true", help="use inotify even on a network mount")
    s.add_argument("--poll-interval", type=float, default=1.0, help="seconds (%(default)s)")
    s.add_argument("--stale-after", type=float, default=120.0, help="seconds (%(default)s)")
    s.add_argument("--show", action="store_true", help="open a browser tab")
    s.set_defaults(func=_serve)
    health_cli.add_commands(sub)
    return p


# --- status --------------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    runs = find_runs(args.path)
    states = [load_state(run) for run in runs]
    views = [None] * len(states) if args.no_scheduler else job_statuses(states)
    if args.json:
        dicts = []
        for run, state, view in zip(runs, states, views, strict=True):
            d = state.to_dict()
            d["alerts"] = health_cli.alerts_of(run, state, args)
            if view is not None:
                d["scheduler"] = view.to_dict()
            dicts.append(d)
        out: Any = (
            dicts[0] if len(states) == 1 and runs[0].root == Path(args.path) else {"runs": dicts}
        )
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(out), indent=2).decode() + "\n")
        return 0
    if len(runs) == 1 and runs[0].root == Path(args.path):
        print(render_status(runs[0], states[0], scheduler=views[0]))
        for alert in health_cli.alerts_of(runs[0], states[0], args):
            print(f"ALERT {alert['kind']}: {alert['detail']}")
    else:
        print(render_run_lines(runs, states))
        for run, state in zip(runs, states, strict=True):
            for alert in health_cli.alerts_of(run, state, args):
                print(f"ALERT {run.root.name} {alert['kind']}: {alert['detail']}")
        print(f"\n{len(runs)} run(s); `ckptdash status {runs[0].root}` shows one in full")
    return 0


def run_word(state: RunState, now: float, stale_after_s: float = STALE_AFTER_S) -> str:
    """The run's state in one word, as the dashboard's badge says it."""
    newest = _newest(state)
    if newest is None:
        return "waiting"
    if newest.outcome == "running":
        seen = newest.last_heartbeat_t
        return "stale" if seen is not None and now - seen > stale_after_s else "running"
    if newest.outcome in ("finished", "failed"):
        return newest.outcome
    if any(r.issued for r in state.requeues if r.attempt == newest.attempt):
        return "requeue pending"
    if newest.end_reason in ("preempted", "terminated"):
        return "preempted"
    return "stopped"


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
        step = "-" if newest is None else _opt(newest.step)
        if newest is not None and newest.max_steps:
            step += f" / {newest.max_steps}"
        rows.append(
            [
                run.root.name,
                run_word(state, now),
                "-" if newest is None else str(newest.attempt),
                step,
                fmt.rough_age(None if newest is None else newest.last_heartbeat_t, now),
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


def _goodput(args: argparse.Namespace) -> int:
    from ckptdash.badput import of_state, render

    runs = find_runs(args.path)
    now = time.time()
    results = [of_state(load_state(run), now) for run in runs]
    if args.json:
        dicts = [g.to_dict() for g in results]
        single = len(runs) == 1 and runs[0].root == Path(args.path)
        out: Any = dicts[0] if single else {"runs": dicts}
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(out), indent=2).decode() + "\n")
        return 0
    print("\n\n".join(render(g) for g in results))
    return 0


def job_statuses(states: list[RunState]) -> list[slurm_admin.JobStatus | None]:
    """SLURM's view of each run's job for ``status`` (None for a run with no SLURM job).

    Once SLURM cannot be asked at all it is not asked again for the other runs: an unreachable
    controller costs one wait.
    """
    out: list[slurm_admin.JobStatus | None] = []
    unavailable = ""
    for state in states:
        job = slurm_admin.job_of(state.attempts.values())
        if job is None:
            out.append(None)
        elif unavailable:
            out.append(slurm_admin.JobStatus(job, asked=True, unavailable=unavailable))
        else:
            status = slurm_admin.job_status(job)
            unavailable = status.unavailable
            out.append(status)
    return out


def render_status(
    run: RunDir,
    state: RunState,
    now: float | None = None,
    scheduler: slurm_admin.JobStatus | None = None,
) -> str:
    """A readable summary of one run: attempts, checkpoints, signals, requeues, commands.

    ``scheduler`` (from :func:`job_statuses`) adds SLURM's view of the job under the header.
    """
    now = time.time() if now is None else now
    lines = [f"run {state.run_id}  {run.root}"]
    try:
        settings = control.read_settings(run)
        requeue = "suspended" if settings.requeue_suspended else "auto"
        pin = _rel(settings.resume_pin, run.root) if settings.resume_pin else "-"
    except CkptDashError as exc:
        requeue, pin = f"unknown ({exc})", "-"
    choice = choose_resume(run, state=state)
    lines.append(f"requeue: {requeue}   resume pin: {pin}")
    if scheduler is not None:
        lines.append(scheduler.describe())
    target = _rel(choice.path, run.root) if choice.path else "fresh start"
    lines.append(f"next resume: {target}  ({choice.reason})")
    lines.append("")
    lines.append(
        _table(
            ["attempt", "host", "job", "started", "outcome", "step", "resumed from"],
            [
                [
                    str(a.attempt),
                    a.host,
                    a.job_id or "-",
                    fmt.clock(a.started_at, "-"),
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
                    fmt.size(c.size_bytes, "-"),
                    "-" if c.duration_s is None else f"{c.duration_s:.2f}",
                    _opt(c.attempt),
                    _rel(c.path, run.root),
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
    for an in state.anomalies:
        pinned = f", pinned {an.pinned}" if an.pinned else ""
        lines.append(
            f"anomaly attempt {an.attempt} step {_opt(an.step)}: {an.reason} ({an.action}{pinned})"
        )
    for c in sorted(state.commands.values(), key=lambda c: c.issued_at or 0):
        extra = c.detail or c.reason or c.error
        lines.append(
            f"command {c.command or '?'} {c.id} by {_who(c.author, c.host)}: {c.status}"
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
    row = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(row.format(*r).rstrip() for r in [header, *rows])


def _opt(value: object) -> str:
    return "-" if value is None else str(value)


# --- controls ----------------------------------------------------------------------------------


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
    state = load_state(run)
    word = run_word(state, time.time())
    if word != "running" and args.no_queue:
        raise CkptDashError(
            f"{run.root}: no attempt is running ({word}); nothing sent. Leave out --no-queue to"
            " queue the command for the next attempt"
        )
    cmd = control.issue(run, args.command, ttl_s=args.ttl)
    print(
        f"{cmd.NAME} {cmd.id} queued in {run.inbox}; `ckptdash status {run.root}` shows the answer"
    )
    if word != "running":
        print(
            f"no attempt is running ({word}): the command will wait for the next attempt until it"
            f" expires in {args.ttl:.0f} s",
            file=sys.stderr,
        )
    return 0


def _requeue(args: argparse.Namespace) -> int:
    run = _require_run(args.run_dir)
    if args.hold or args.release or args.cancel_pending:
        return _scheduler_control(run, args)
    if args.yes:
        raise CkptDashError("--yes only confirms --cancel-pending; leave it out here")
    if args.suspend or args.resume:
        control.update_settings(run, requeue_suspended=bool(args.suspend))
    settings = control.read_settings(run)
    print(f"auto-requeue: {'suspended' if settings.requeue_suspended else 'on'} ({run.settings})")
    if args.suspend or args.resume:
        _mirror_requeue(run, args.job, allowed=bool(args.resume))
    return 0


def _job_for(run: RunDir, given: str | None) -> str | None:
    if given:
        return slurm_admin.check_job_id(given)
    return slurm_admin.job_of(load_state(run).attempts.values())


def _mirror_requeue(run: RunDir, given: str | None, *, allowed: bool) -> None:
    """Copy the suspend setting onto the SLURM job (Requeue=0/1) when SLURM can be asked."""
    job = _job_for(run, given)
    if job is not None:
        print(slurm_admin.mirror_requeue(job, allowed))


def _scheduler_control(run: RunDir, args: argparse.Namespace) -> int:
    """--hold / --release / --cancel-pending: act on the job in SLURM's queue."""
    job = _job_for(run, args.job)
    if job is None:
        raise CkptDashError(
            f"{run.root}: no attempt of this run recorded a SLURM job id; name the job with"
            " --job JOBID"
        )
    if args.cancel_pending and not args.yes:
        raise CkptDashError(
            f"slurm job {job}: --cancel-pending cancels the requeued job (the run keeps its"
            " checkpoints); add --yes to confirm"
        )
    if args.hold:
        view = slurm_admin.hold(job)
        print(f"slurm job {job}: held ({view.describe()}); `ckptdash requeue {run.root} --release`")
    elif args.release:
        view = slurm_admin.release(job)
        print(f"slurm job {job}: released ({view.describe()})")
    else:
        after = slurm_admin.cancel_pending(job)
        state = after.describe() if after is not None else "gone from the queue"
        print(f"slurm job {job}: cancelled while pending ({state})")
    return 0


def _resume(args: argparse.Namespace) -> int:
    run = _require_run(args.run_dir)
    state = load_state(run)
    if args.pin:
        match = find_recorded(state, args.pin)
        if match is None:
            raise CkptDashError(
                f"{args.pin}: not a checkpoint this run recorded; pick a path from"
                f" `ckptdash status {run.root}` (pins are limited to recorded checkpoints)"
            )
        control.update_settings(run, resume_pin=match.path)
    elif args.clear:
        control.update_settings(run, resume_pin=None)
    choice = choose_resume(run, state=state)
    print(f"next attempt resumes from: {choice.path or 'nothing (fresh start)'}")
    print(f"because: {choice.reason}")
    for path, reason in choice.skipped:
        print(f"skipped {path}: {reason}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ckptdash.demo import run_demo

    if not 0 <= args.port <= 65535:
        raise CkptDashError(f"--port {args.port}: must be 0 (any free port) to 65535")

    return run_demo(
        Path(args.run_dir),
        steps=args.steps,
        preempt_every_s=args.preempt_every,
        max_preemptions=args.max_preemptions,
        kills=args.kills,
        port=None if args.no_serve else args.port,
        exit_when_done=args.exit_when_done,
    )


def _serve(args: argparse.Namespace) -> int:
    from ckptdash.dash import access
    from ckptdash.dash.app import DashOptions, ServeOptions, serve

    if args.poll and args.inotify:
        raise CkptDashError("--poll and --inotify: choose one (or neither: detected per mount)")
    if args.no_auth and args.token_file:
        raise CkptDashError("--no-auth and --token-file: choose one")
    # Secrets come from files only their owner can read, or the environment: never argv.
    if args.keyfile:
        access.read_secret_file(args.keyfile, "--keyfile")  # refused if others can read it
    env_token, env_password = access.environment_secrets()
    token = access.read_secret_file(args.token_file, "--token-file") if args.token_file else None
    password: str | None = env_password
    if args.basic_auth:
        password = access.read_secret_file(args.basic_auth, "--basic-auth")
    serve(
        args.path,
        ServeOptions(
            address=args.address,
            port=args.port,
            allow_remote=args.allow_remote,
            basic_auth=None if password is None else access.basic_auth_secret(password),
            origins=tuple(args.origin),
            show=args.show,
            token=token or env_token,
            no_auth=args.no_auth,
            allow_hosts=tuple(args.allow_host),
            certfile=args.certfile,
            keyfile=args.keyfile,
        ),
        DashOptions(
            watch="poll" if args.poll else "inotify" if args.inotify else "auto",
            poll_interval_s=args.poll_interval,
            stale_after_s=args.stale_after,
        ),
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
