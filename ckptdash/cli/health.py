"""The command line of run health: ``ckptdash watch`` and ``ckptdash health``, and the alerts
``ckptdash status`` shows. :mod:`ckptdash.cli` adds these commands to its parser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ckptdash import control
from ckptdash.analysis import health
from ckptdash.analysis.health import Thresholds, parse_assignments
from ckptdash.errors import CkptDashError, MalformedControlFile
from ckptdash.ops import liveness
from ckptdash.ops.watch import ACTIONS, Watch, Webhook, parse_rules
from ckptdash.rundir import RunDir, find_runs
from ckptdash.state import RunState
from ckptdash.state.reading import load_state
from ckptdash.terminal import one_line


def add_threshold_options(p: argparse.ArgumentParser) -> None:
    """``--threshold NAME=VALUE`` (repeatable) and ``--hung-after SECONDS``."""
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a health threshold for this command (see `ckptdash health RUN`), e.g."
        " stale_after_s=900; overrides the run's settings",
    )
    p.add_argument(
        "--hung-after", type=float, metavar="SECONDS", help="same as --threshold hung_after_s=S"
    )


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = dict(parse_assignments(getattr(args, "threshold", []) or []))
    if getattr(args, "hung_after", None) is not None:
        out["hung_after_s"] = args.hung_after
    Thresholds().updated(out, where="command line:")  # fail early, naming the bad one
    return out


def thresholds_of(run: RunDir, changes: dict[str, Any]) -> Thresholds:
    """``run``'s thresholds, read fresh from its settings, with the command line's ``changes``."""
    return health.resolve_thresholds(control.read_settings(run).health, changes, str(run.settings))


def alerts_of(run: RunDir, state: RunState, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The alerts that hold for ``state`` now, as ``status --json`` lists them.

    A run whose settings cannot be read (a colleague's 0600 file) is checked against the
    default thresholds, said once on stderr: it never fails the status of the others."""
    given = overrides(args)
    try:
        th = thresholds_of(run, given)
    except MalformedControlFile as exc:
        print(one_line(f"ckptdash: {exc}; alerts use the default thresholds"), file=sys.stderr)
        th = Thresholds().updated(given, where="command line:")
    return [a.to_dict() for a in health.detect(state, th, gone=liveness.gone_here(state))]


def add_commands(sub: Any) -> None:
    """Add ``watch`` and ``health`` to the ``ckptdash`` subcommands."""
    rules = ", ".join(f"{a}={x}" for a, xs in ACTIONS.items() for x in xs)
    s = sub.add_parser(
        "watch",
        help="raise health alerts as they begin and end; notify and act (long-running)",
        description="Watch a run (or a folder of runs) and fire each health alert once as it"
        " begins and once as it clears: to --exec and/or --webhook, and act on it with --on."
        " Every alert and action is written into the run.",
    )
    s.add_argument("path", help="a run directory, or a folder of run directories")
    s.add_argument(
        "--exec", dest="exec_cmd", metavar="CMD", help="run CMD with the alert JSON on stdin"
    )
    s.add_argument("--webhook", metavar="URL", help="POST the alert JSON to URL (retried)")
    s.add_argument(
        "--webhook-per-minute", type=int, default=20, help="rate limit (%(default)s posts a minute)"
    )
    s.add_argument(
        "--on", action="append", default=[], metavar="ALERT=ACTION", help=f"act: {rules}"
    )
    s.add_argument(
        "--interval", type=float, default=5.0, help="seconds between looks (%(default)s)"
    )
    s.add_argument("--once", action="store_true", help="look once and exit (cron)")
    add_threshold_options(s)
    s.set_defaults(func=_watch)

    s = sub.add_parser("health", help="show the alerts of a run and set its health thresholds")
    s.add_argument("run_dir")
    s.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="store a threshold"
    )
    s.add_argument("--unset", action="append", default=[], metavar="NAME", help="back to default")
    s.set_defaults(func=_health)


def _watch(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise CkptDashError(f"--interval {args.interval}: must be > 0 seconds")
    rules = parse_rules(args.on)
    webhook = (
        Webhook(args.webhook, per_minute=max(1, args.webhook_per_minute)) if args.webhook else None
    )
    watch = Watch(
        args.path, overrides=overrides(args), exec_cmd=args.exec_cmd, webhook=webhook, rules=rules
    )
    print(f"ckptdash watch: {args.path}: looking every {args.interval:g} s", flush=True)
    if watch.waiting:
        print(
            f"ckptdash watch: {args.path} holds no ckptdash events yet (a pending job?):"
            " waiting for them",
            flush=True,
        )
    try:
        if args.once:
            watch.poll()
        else:
            watch.run_forever(args.interval)
    finally:
        watch.close()
    return 0


def _health(args: argparse.Namespace) -> int:
    (run,) = find_runs(args.run_dir)[:1]
    if run.root != Path(args.run_dir):
        raise CkptDashError(
            f"{args.run_dir}: a folder of runs; pass one run directory, e.g. {run.root}"
        )
    if args.set or args.unset:
        current = dict(control.read_settings(run).health)
        for name in args.unset:
            current.pop(name, None)
        changes = parse_assignments(args.set)
        Thresholds().updated({**current, **changes}, where="--set:")
        current.update({k: float(v) for k, v in changes.items()})
        control.update_settings(run, health=current)
    th = thresholds_of(run, {})
    stored = control.read_settings(run).health
    for name, value in vars(th).items():
        mark = "  (run setting)" if name in stored else ""
        print(f"{name:18} {value:g}{mark}")
    state = load_state(run)
    alerts = health.detect(state, th, gone=liveness.gone_here(state))
    print()
    if not alerts:
        print("no alerts")
    for a in alerts:
        print(one_line(f"ALERT {a.kind}: {a.detail}"))
    sys.stdout.flush()
    return 0
