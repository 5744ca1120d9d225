"""``ckptdash`` on the command line: status, the controls, the demo.

    ckptdash status RUN_DIR [--json]        the run state in full
    ckptdash status FOLDER                   one line per run, like squeue
    ckptdash goodput RUN_DIR [--json]       where the time went: goodput, badput by cause
    ckptdash save RUN_DIR [--wait]           Save now (a command to the running job)
    ckptdash stop RUN_DIR --yes [--wait]     Stop after save
    ckptdash requeue RUN_DIR --suspend|--resume   (mirrored onto the SLURM job when SLURM is here)
    ckptdash requeue RUN_DIR --hold|--release|--cancel-pending --yes   (a requeued, pending job)
    ckptdash resume RUN_DIR [--pin PATH [--sticky]|--clear|--fresh]
    ckptdash demo                            a small real run: preemptions, a kill, resumes
    ckptdash serve PATH [--port N]           the live dashboard in a browser tab
    ckptdash watch PATH [--on hung=requeue]  raise health alerts, notify, act (docs/health.md)
    ckptdash health RUN_DIR [--set K=V]      alerts and health thresholds of a run

Every user error is one line on stderr saying what is wrong and how to fix it,
and exit status 2; never a traceback.

This module holds the parser and the controls (save, stop, requeue, resume); what ``status``
and ``goodput`` print is :mod:`ckptdash.cli.status`, ``demo`` and ``serve`` are
:mod:`ckptdash.cli.serve`, ``watch`` and ``health`` :mod:`ckptdash.cli.health`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ckptdash import __version__, control, humanize
from ckptdash.cli import health as health_cli
from ckptdash.cli import hints as cli_hints
from ckptdash.cli import serve as cli_serve
from ckptdash.cli import wait as cli_wait
from ckptdash.cli.status import goodput_command, render_status, run_word, status_command
from ckptdash.errors import CkptDashError
from ckptdash.ops import actions
from ckptdash.resume import artifact_refusal, choose_resume, find_recorded
from ckptdash.rundir import RunDir, find_runs
from ckptdash.schedulers.base import Queue
from ckptdash.state.reading import load_state
from ckptdash.terminal import one_line, printable_output

__all__ = ["main", "render_status"]  # render_status: `ckptdash status RUN` in a notebook

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ckptdash`` command; returns the exit status."""
    # Event text from the run directory is printed below: one filter keeps terminal control
    # characters in it from reaching the terminal (see ckptdash/terminal.py).
    with printable_output():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if (typo := cli_hints.unknown_command(argv, commands.choices)) is not None:
        print(f"ckptdash: {typo}", file=sys.stderr)
        return EXIT_USAGE
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
DEFAULT_WAIT_S = 60.0


def _add_wait(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--wait",
        action="store_true",
        help="wait for the job's answer (applied, rejected or expired) and print it; exit 1"
        " unless applied",
    )
    s.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="S",
        help="with --wait: give up waiting after S seconds (the command stays queued)"
        " (%(default)s)",
    )


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
    s.set_defaults(func=status_command)

    s = sub.add_parser(
        "goodput", help="where a run's time went: goodput and badput by cause (docs/goodput.md)"
    )
    s.add_argument("path", help="a run directory, or a folder of run directories")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=goodput_command)

    s = sub.add_parser("save", help="ask the running job to save a checkpoint now")
    s.add_argument("run_dir")
    s.add_argument(
        "--ttl", type=float, default=control.DEFAULT_TTL_S, help="expire after this many seconds"
    )
    s.add_argument("--no-queue", action="store_true", help=_NO_QUEUE)
    _add_wait(s)
    s.set_defaults(func=_issue, command="save_now")

    s = sub.add_parser("stop", help="ask the running job to save, then stop without requeue")
    s.add_argument("run_dir")
    s.add_argument(
        "--ttl", type=float, default=control.DEFAULT_TTL_S, help="expire after this many seconds"
    )
    s.add_argument("--yes", action="store_true", help="confirm: this ends the training job")
    s.add_argument("--no-queue", action="store_true", help=_NO_QUEUE)
    _add_wait(s)
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
        "--wait",
        action="store_true",
        help="accepted for symmetry with save/stop: requeue answers at once (see its output)",
    )
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
    g.add_argument(
        "--fresh",
        action="store_true",
        help="the next attempt starts fresh, and no checkpoint from before it is chosen again"
        " (after the model changed: see docs/resume-rule.md)",
    )
    s.add_argument(
        "--sticky",
        action="store_true",
        help="with --pin: keep the pin after an attempt loaded it (by default it is used once)",
    )
    s.set_defaults(func=_resume)

    cli_serve.add_commands(sub)
    health_cli.add_commands(sub)
    return p


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
    if args.wait and not (args.timeout > 0):
        raise CkptDashError(f"--timeout {args.timeout}: must be a positive number of seconds")
    send = actions.stop_after_save if args.command == "stop_after_save" else actions.save_now
    cmd = send(run, ttl_s=args.ttl)
    short = humanize.short_id(cmd.id)
    then = (
        "waiting for the job's answer"
        if args.wait
        else f"`ckptdash status {run.root}` shows the answer"
    )
    print(f"{cmd.NAME} {short} queued in {run.inbox}; {then}", flush=True)
    if word != "running":
        print(
            f"no attempt is running ({word}): the command will wait for the next attempt until it"
            f" expires in {args.ttl:.0f} s",
            file=sys.stderr,
        )
    if not args.wait:
        return 0
    info = cli_wait.wait_for_answer(run, cmd.id, args.timeout)
    if info is None:
        print(
            f"{cmd.NAME} {short}: no answer within {args.timeout:g} s; it stays queued until it"
            f" expires ({args.ttl:.0f} s after it was sent); `ckptdash status {run.root}` shows"
            " the answer",
            file=sys.stderr,
        )
        return 1
    print(one_line(cli_wait.describe_answer(cmd.NAME, info, run)))
    return 0 if info.status == "applied" else 1


def _requeue(args: argparse.Namespace) -> int:
    run = _require_run(args.run_dir)
    if args.hold or args.release or args.cancel_pending:
        return _scheduler_control(run, args)
    if args.yes:
        raise CkptDashError("--yes only confirms --cancel-pending; leave it out here")
    if args.suspend or args.resume:
        actions.set_requeue(run, suspended=bool(args.suspend))
    settings = control.read_settings(run)
    print(f"auto-requeue: {'suspended' if settings.requeue_suspended else 'on'} ({run.settings})")
    if args.suspend or args.resume:
        _mirror_requeue(run, args.job, allowed=bool(args.resume))
    if args.wait:
        print(
            "nothing to wait for: the setting above is in force now (the job reads it when a"
            " signal arrives; it sends no answer)",
            file=sys.stderr,
        )
    return 0


def _job_for(run: RunDir, given: str | None) -> tuple[Queue, str] | None:
    return actions.job_for(load_state(run).attempts.values(), given)


def _mirror_requeue(run: RunDir, given: str | None, *, allowed: bool) -> None:
    """Copy the suspend setting onto the job's own requeue switch (SLURM's Requeue=0/1, Grid
    Engine's -r n/y) when the scheduler can be asked."""
    found = _job_for(run, given)
    if found is not None:
        queue, job = found
        # A job named with --job is the user's choice; one read from the log must be the run's.
        root = None if given else run.root
        print(actions.mirror_requeue(queue, job, allowed=allowed, run_root=root))


def _scheduler_control(run: RunDir, args: argparse.Namespace) -> int:
    """--hold / --release / --cancel-pending: act on the job in the scheduler's queue."""
    found = _job_for(run, args.job)
    if found is None:
        raise CkptDashError(
            f"{run.root}: no attempt of this run recorded a scheduler's job id (SLURM, Grid"
            " Engine); name the job with --job JOBID"
        )
    queue, job = found
    if args.cancel_pending and not args.yes:
        raise CkptDashError(
            f"{queue.name} job {job}: --cancel-pending cancels the requeued job (the run keeps"
            " its checkpoints); add --yes to confirm"
        )
    # Refused (SchedulerRefused, exit 2): a job that is not the user's, or, read from the log,
    # not the run's own (Queue.verify_job). A job named with --job is the user's choice.
    root = None if args.job else run.root
    if args.hold:
        view = actions.hold(queue, job, run_root=root)
        print(
            f"{queue.name} job {job}: held ({view.describe()});"
            f" `ckptdash requeue {run.root} --release`"
        )
    elif args.release:
        view = actions.release(queue, job, run_root=root)
        print(f"{queue.name} job {job}: released ({view.describe()})")
    else:
        after = actions.cancel_pending(queue, job, run_root=root)
        state = after.describe() if after is not None else "gone from the queue"
        print(f"{queue.name} job {job}: cancelled while pending ({state})")
    return 0


def _resume(args: argparse.Namespace) -> int:
    run = _require_run(args.run_dir)
    state = load_state(run)
    lifted = False
    if args.sticky and not args.pin:
        raise CkptDashError("--sticky goes with --pin PATH: it keeps that pin after it is used")
    if args.pin:
        match = find_recorded(state, args.pin)
        if match is None:
            raise CkptDashError(
                f"{args.pin}: not a checkpoint this run recorded; pick a path from"
                f" `ckptdash status {run.root}` (pins are limited to recorded checkpoints)"
            )
        if match.artifact:
            raise CkptDashError(artifact_refusal(match))
        lifted = actions.pin(run, match.path, sticky=args.sticky).lifted_crash_loop
    elif args.clear:
        actions.clear_pin(run)
    elif args.fresh:
        lifted = actions.start_fresh(run).lifted_crash_loop
        print(
            "the next attempt starts fresh; checkpoints recorded before it are never chosen again"
        )
    if lifted:
        print(actions.LIFTED)
    choice = choose_resume(run, state=state)
    print(one_line(f"next attempt resumes from: {choice.path or 'nothing (fresh start)'}"))
    print(one_line(f"because: {choice.reason}"))
    for path, reason in choice.skipped:
        print(one_line(f"skipped {path}: {reason}"))
    for path, reason in choice.passed_over:
        print(one_line(f"passed over {path}: {reason} (an artifact: cannot resume training)"))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
