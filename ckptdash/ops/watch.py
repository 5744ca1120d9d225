"""``ckptdash watch``: raise each health alert once, tell someone, act, and record it all.

A :class:`Watch` tails a run (or a folder of runs) like the dashboard does, runs the health
detectors every ``interval_s``, and for each alert that begins or ends:

1. writes ``alert_raised`` / ``alert_cleared`` into the run (source ``watch``), durable, so
   the dashboard and the next person see it — and a restarted watch does not fire it again;
2. runs ``--exec CMD`` with the alert as one JSON object on stdin, and/or POSTs the same JSON
   to ``--webhook URL`` (retried, rate-limited, from a sender thread so a slow endpoint never
   delays detection);
3. for a raised alert with a rule (``--on hung=requeue``), acts on the run's job through its
   scheduler's :class:`~ckptdash.schedulers.base.Queue` (SLURM, Grid Engine) and writes
   ``action_taken`` with the command and its result.

The alert JSON::

    {"event": "raised", "alert": "hung", "since": 1764430300.0, "detail": "...",
     "run": "3f2a91c0d4e1", "root": "runs/exp1", "attempt": 3, "job_id": "4242",
     "t": 1764430305.1, "who": "ana@login1 (ckptdash watch)"}
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

from ckptdash import control, schedulers
from ckptdash.analysis import health
from ckptdash.analysis.health import Alert, Thresholds
from ckptdash.errors import CkptDashError, RunDirError, SchedulerError
from ckptdash.events import ActionTaken, AlertCleared, AlertRaised
from ckptdash.ops import liveness
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.schedulers.base import Runner
from ckptdash.state import RunState
from ckptdash.state.runset import RunSet
from ckptdash.terminal import one_line

ACTIONS: Final = {
    "hung": ("requeue", "cancel"),
    "restart_storm": ("hold",),
    "crash_loop": ("hold",),
}
"""Which action each alert may trigger (``--on ALERT=ACTION``)."""

EXEC_TIMEOUT_S: Final = 30.0


def parse_rules(items: list[str]) -> dict[str, str]:
    """``["hung=requeue"]`` → ``{"hung": "requeue"}``; anything else raises with the choices."""
    rules: dict[str, str] = {}
    for item in items:
        alert, _, action = item.partition("=")
        if action not in ACTIONS.get(alert, ()):
            choices = ", ".join(f"{a}={x}" for a, xs in ACTIONS.items() for x in xs)
            raise CkptDashError(f"--on {item!r}: not a rule; use one of {choices}")
        rules[alert] = action
    return rules


def thresholds_for(run: RunDir, overrides: dict[str, Any]) -> Thresholds:
    """The run's thresholds (:func:`~ckptdash.analysis.health.resolve_thresholds` over its
    settings file, read fresh)."""
    return health.resolve_thresholds(
        control.read_settings(run).health, overrides, str(run.settings)
    )


def who() -> str:
    return f"{control.user_at_host()} (ckptdash watch, pid {os.getpid()})"


# --- notifications ----------------------------------------------------------------------------


class Webhook:
    """POSTs JSON to one URL from a daemon thread: retried with backoff, rate-limited.

    At most ``per_minute`` posts start in any ``window_s`` (a storm of alerts across many
    runs must not flood a pager); the rest wait their turn in order, never dropped while the process
    lives. A post that fails ``tries`` times is reported on ``log`` and given up.
    """

    def __init__(
        self,
        url: str,
        *,
        per_minute: int = 20,
        window_s: float = 60.0,
        tries: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 10.0,
        log: TextIO = sys.stderr,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise CkptDashError(f"--webhook {url!r}: use an http:// or https:// URL")
        self.url = url
        self.per_minute = per_minute
        self.window_s = window_s
        self.tries = tries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.log = log
        self.sent = 0
        self.failed = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._starts: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckptdash-webhook", daemon=True)
        self._thread.start()

    def post(self, payload: dict[str, Any]) -> None:
        self._queue.put(payload)

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (up to ``timeout_s``), then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._stop.set()

    def idle(self) -> bool:
        return self._queue.unfinished_tasks == 0

    def _run(self) -> None:
        while True:
            payload = self._queue.get()
            try:
                if payload is None:
                    return
                self._rate_limit()
                self._send(payload)
            finally:
                self._queue.task_done()

    def _rate_limit(self) -> None:
        while True:
            now = time.monotonic()
            self._starts = [t for t in self._starts if t > now - self.window_s]
            if len(self._starts) < self.per_minute:
                self._starts.append(now)
                return
            if self._stop.wait(self._starts[0] + self.window_s - now):
                return

    def _send(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        error = ""
        for attempt in range(self.tries):
            req = urllib.request.Request(
                self.url, data=data, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    if 200 <= resp.status < 300:
                        self.sent += 1
                        return
                    error = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                error = f"HTTP {exc.code}"
                if 400 <= exc.code < 500 and exc.code != 429:
                    break  # the request itself is wrong: retrying will not help
            except (urllib.error.URLError, OSError) as exc:
                error = str(getattr(exc, "reason", exc))
            if self._stop.wait(self.backoff_s * 2**attempt):
                break
        self.failed += 1
        print(
            f"ckptdash watch: webhook {self.url}: {payload.get('alert')} {payload.get('event')}"
            f" not delivered ({error}); check the URL and that it accepts a JSON POST",
            file=self.log,
            flush=True,
        )


def run_exec(cmd: str, payload: dict[str, Any]) -> tuple[int, str]:
    """Run ``cmd`` in a shell with the alert JSON on stdin; (exit status, last output line)."""
    try:
        proc = subprocess.run(
            cmd,
            shell=True,
            input=json.dumps(payload) + "\n",
            capture_output=True,
            text=True,
            timeout=EXEC_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {EXEC_TIMEOUT_S:.0f} s"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode, lines[-1][-300:] if lines else ""


# --- actions ----------------------------------------------------------------------------------


def act(
    action: str,
    job: str,
    runner: Runner | None = None,
    *,
    run_root: str | os.PathLike[str] | None = None,
    scheduler: str = "slurm",
) -> tuple[str, bool, str]:
    """Carry out ``action`` on ``scheduler``'s job ``job``: (the command, ok, what happened).

    Through the scheduler's :class:`~ckptdash.schedulers.base.Queue` (``slurm``,
    ``gridengine``), only on a job its ``verify_job`` accepts (yours, and started by the run
    at ``run_root`` when the id came from its log); otherwise nothing runs and the refusal is
    what happened.
    """
    if action not in ("requeue", "cancel", "hold"):
        raise CkptDashError(f"unknown action {action!r}")
    q = schedulers.queue_for(scheduler, runner)
    if q is None:
        return "", False, f"ckptdash cannot act through scheduler {scheduler!r}"
    shown = q.act_command(action, job)
    try:
        view = q.verify_job(job, run_root=run_root)
        if view is None:
            verb = "held" if action == "hold" else "done"
            return shown, False, f"not {verb}: the job is unknown to {q.label}"
        command, what = q.act(action, view)
    except SchedulerError as exc:
        return shown, False, str(exc)
    return command, True, what


# --- the watch --------------------------------------------------------------------------------


@dataclass
class _Run:
    state: RunState  # the run set's (ckptdash.state.runset): read there, judged here
    open: dict[str, Alert] = field(default_factory=dict)
    writers: dict[int, EventWriter] = field(default_factory=dict)


@dataclass
class Fired:
    """One alert that began or ended during a poll (what :meth:`Watch.poll` returns)."""

    root: Path
    event: str  # "raised" / "cleared"
    alert: Alert
    action: tuple[str, bool, str] | None = None


class Watch:
    """Watches ``path`` (a run or a folder of runs); see the module docstring.

    ``runner`` replaces the scheduler's commands (tests); ``clock`` the time now.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        overrides: dict[str, Any] | None = None,
        exec_cmd: str | None = None,
        webhook: Webhook | None = None,
        rules: dict[str, str] | None = None,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.time,
        log: TextIO = sys.stdout,
    ) -> None:
        self.path = Path(path)
        self.overrides = dict(overrides or {})
        self.exec_cmd = exec_cmd
        self.webhook = webhook
        self.rules = dict(rules or {})
        self.runner = runner
        self.clock = clock
        self.log = log
        self.who = who()
        self._set = RunSet(self.path)  # opens and reads the runs, as the dashboard's does
        try:
            self._set.discover()
        except RunDirError:
            # A job still pending has no run directory yet: wait for it, as the dashboard does.
            if self.path.exists() and not self.path.is_dir():
                raise
        self._runs: dict[Path, _Run] = {}
        self._said: set[tuple[Path, str]] = set()  # (run, problem) already printed
        Thresholds().updated(self.overrides, where="command line:")  # a bad one fails at start
        for run in self._set.open.values():
            self._thresholds(run.rd)  # a run's unreadable settings: said now, once

    def poll(self) -> list[Fired]:
        """Read what is new, run the detectors, fire and act on what changed."""
        fired: list[Fired] = []
        with contextlib.suppress(RunDirError, OSError):  # none right now: keep what we have
            self._set.discover()
        # One run at a time, a piece at a time: the first look at a 10 GB log (or at 1,000
        # runs) holds one piece of it, not all of it (benchmarks/scale.py measures it).
        for opened in self._set.poll():
            root = opened.rd.root
            run = self._runs.get(root)
            if run is None:  # opened from its snapshot when one could be trusted, then read
                print(f"ckptdash watch: watching {root}", file=self.log, flush=True)
                run = self._runs[root] = _Run(opened.state)
                run.open = _open_alerts(run.state)  # a restarted watch does not fire again
            fired.extend(self._check(root, run))
        return fired

    @property
    def waiting(self) -> bool:
        """No run to watch yet: the path does not exist or holds no events (a pending job)."""
        return not self._set.open

    def run_forever(self, interval_s: float, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        while True:
            self.poll()
            if stop.wait(interval_s):
                return

    def close(self) -> None:
        for run in self._runs.values():
            for w in run.writers.values():
                w.close()
        self._set.close()
        if self.webhook is not None:
            self.webhook.close()

    def _check(self, root: Path, run: _Run) -> list[Fired]:
        rd = RunDir(root)
        th = self._thresholds(rd)
        now = self.clock()
        gone = liveness.gone_here(run.state, now=now)
        active = {a.kind: a for a in health.detect(run.state, th, now, gone=gone)}
        fired: list[Fired] = []
        for kind in health.KINDS:
            if kind in active and kind not in run.open:
                alert = active[kind]
                run.open[kind] = alert
                f = Fired(root, "raised", alert)
                self._record(rd, run, AlertRaised, alert, since=alert.since)
                self._notify(rd, run, f)
                rule = self.rules.get(kind)
                if rule is not None:
                    f.action = self._act(rd, run, alert, rule)
                fired.append(f)
            elif kind not in active and kind in run.open:
                alert = run.open.pop(kind)
                f = Fired(root, "cleared", alert)
                self._record(rd, run, AlertCleared, alert)
                self._notify(rd, run, f)
                fired.append(f)
        return fired

    def _thresholds(self, rd: RunDir) -> Thresholds:
        """The run's thresholds; when its settings cannot be read or hold a bad threshold (a
        colleague's 0600 settings.json in a shared folder), the defaults, said once per run
        and problem: one run's settings never stop the watch over the others."""
        try:
            return thresholds_for(rd, self.overrides)
        except CkptDashError as exc:
            if (rd.root, str(exc)) not in self._said:
                self._said.add((rd.root, str(exc)))
                print(
                    one_line(f"ckptdash watch: {rd.root}: {exc}; using the default thresholds"),
                    file=self.log,
                    flush=True,
                )
            return Thresholds().updated(self.overrides)

    def _writer(self, rd: RunDir, run: _Run, attempt: int) -> EventWriter:
        w = run.writers.get(attempt)
        if w is None:
            w = run.writers[attempt] = EventWriter(rd, attempt=attempt, rank=0)
        return w

    def _attempt(self, run: _Run, alert: Alert) -> int:
        if alert.attempt is not None:
            return alert.attempt
        return max(run.state.attempts) if run.state.attempts else 0

    def _record(self, rd: RunDir, run: _Run, kind: type[Any], alert: Alert, **extra: Any) -> None:
        try:
            self._writer(rd, run, self._attempt(run, alert)).emit(
                kind, alert=alert.kind, detail=alert.detail, source="watch", who=self.who, **extra
            )
        except CkptDashError as exc:  # a read-only run directory: still notify and act
            print(f"ckptdash watch: {rd.root}: not recorded: {exc}", file=self.log, flush=True)

    def _payload(self, rd: RunDir, run: _Run, f: Fired) -> dict[str, Any]:
        return {
            "event": f.event,
            "alert": f.alert.kind,
            "since": f.alert.since,
            "detail": f.alert.detail,
            "run": run.state.run_id,
            "root": str(rd.root),
            "attempt": f.alert.attempt,
            "job_id": _job_id(run.state),
            "t": self.clock(),
            "who": self.who,
        }

    def _notify(self, rd: RunDir, run: _Run, f: Fired) -> None:
        payload = self._payload(rd, run, f)
        print(
            one_line(
                f"{time.strftime('%H:%M:%S')} {rd.root}: {f.alert.kind} {f.event}: {f.alert.detail}"
            ),
            file=self.log,
            flush=True,
        )
        if self.exec_cmd:
            rc, out = run_exec(self.exec_cmd, payload)
            if rc != 0:
                print(
                    f"ckptdash watch: --exec {self.exec_cmd!r} exited {rc}: {out}",
                    file=self.log,
                    flush=True,
                )
        if self.webhook is not None:
            self.webhook.post(payload)

    def _act(self, rd: RunDir, run: _Run, alert: Alert, action: str) -> tuple[str, bool, str]:
        job = schedulers.job_of(run.state.attempts.values())
        if job is None:
            result: tuple[str, bool, str] = (
                "",
                False,
                "no attempt of this run recorded a scheduler's job id (SLURM, Grid Engine):"
                " nothing to act on",
            )
        else:
            result = act(action, job[1], self.runner, run_root=rd.root, scheduler=job[0])
        command, ok, what = result
        try:
            self._writer(rd, run, self._attempt(run, alert)).emit(
                ActionTaken,
                alert=alert.kind,
                action=action,
                command=command,
                ok=ok,
                result=what,
                source="watch",
                who=self.who,
            )
        except CkptDashError as exc:
            print(f"ckptdash watch: {rd.root}: not recorded: {exc}", file=self.log, flush=True)
        print(
            one_line(
                f"{time.strftime('%H:%M:%S')} {rd.root}: --on {alert.kind}={action}:"
                f" `{command}` {'ok' if ok else 'FAILED'}: {what}"
            ),
            file=self.log,
            flush=True,
        )
        return result


def _job_id(state: RunState) -> str | None:
    """The run's newest scheduler job id (SLURM's or Grid Engine's), for the alert JSON."""
    job = schedulers.job_of(state.attempts.values())
    return None if job is None else job[1]


def _open_alerts(state: RunState) -> dict[str, Alert]:
    """Alerts a watch raised in this run and no watch cleared yet (from the run's log)."""
    open_: dict[str, Alert] = {}
    for rec in state.alert_log:
        if rec.source != "watch":
            continue
        if rec.event == "alert_raised":
            open_[rec.alert] = Alert(rec.alert, rec.since or rec.t, rec.detail, rec.attempt)
        elif rec.event == "alert_cleared":
            open_.pop(rec.alert, None)
    return open_
