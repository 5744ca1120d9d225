"""The training-side engine shared by :class:`~ckptdash.Monitor` and the Lightning callback.

At each step boundary the loop calls :meth:`Session.boundary`. Almost always it
returns ``None`` after decrementing a counter (the hot path). Every
``check_every`` steps — a count derived from the measured step time so that a
check happens about every ``agree_interval_s`` — it:

1. takes the signals the record-only handlers saw;
2. on rank 0, claims commands from the inbox (at most every ``poll_interval_s``)
   and writes a heartbeat (at most every ``heartbeat_interval_s``);
3. with several ranks, agrees on what to do through one small ``all_reduce``,
   so every rank saves the same step even if only one rank got the signal;
4. returns a :class:`Decision`: save with which trigger, then requeue or stop.

The caller saves; :meth:`Session.after_save` answers the commands with the
checkpoint path and runs the requeue policy (read fresh from the run
directory's settings at that moment, so a click just before preemption counts).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptdash import control
from ckptdash.errors import CheckpointChoiceError, CkptDashError, RunDirError
from ckptdash.events import (
    AnomalyDetected,
    CheckpointDirDeclared,
    CheckpointInvalid,
    CheckpointSaved,
    CommandApplied,
    CommandExpired,
    CommandReceived,
    CommandRejected,
    ControlFailed,
    ExceptionRaised,
    Heartbeat,
    RequeueIssued,
    RequeueSkipped,
    RunFailed,
    RunFinished,
    RunResumed,
    RunStarted,
    SignalReceived,
    Trigger,
    decode_lines,
)
from ckptdash.resume import ResumeChoice, choose_resume, judge_given
from ckptdash.rundir import RunDir
from ckptdash.tail import MAX_LINE_BYTES
from ckptdash.train import anomaly, dist
from ckptdash.train.config import ConfigError, SignalAction, TrainConfig
from ckptdash.train.guard import Claimant, RunGuard
from ckptdash.train.recovery import recover
from ckptdash.train.scheduler import Scheduler, detect
from ckptdash.train.signals import SignalRecorder, signal_number
from ckptdash.train.watchdog import Pulser
from ckptdash.writer import EventWriter

# Codes carried by the agreement collective (MAX wins across ranks).
_NO_SIGNAL, _TERMINATE, _REQUEUE = 0, 1, 2
_ACTION_CODE = {"ignore": _NO_SIGNAL, "terminate": _TERMINATE, "requeue": _REQUEUE}
_ATTEMPT_RE = re.compile(r"^A(\d{4,})\.")
_RANK0_RE = re.compile(r"^A(\d{4,})\.R0000\.")
SIGNAL_STOPS: list[str] = []
"""Why each signal stop in this process stopped training (``preempted``, ``terminated``): a
launcher helper must then not report the function's early return as a final result."""


def _attempt_jobs(files: list[Path]) -> dict[int, str | None]:
    """The job id of each earlier attempt, from the ``run_started`` that opens its rank-0 file
    (one line read per attempt, not the whole log)."""
    jobs: dict[int, str | None] = {}
    for path in files:
        m = _RANK0_RE.match(path.name)
        if m is None:
            continue
        try:
            with open(path, "rb") as f:
                first = f.readline(MAX_LINE_BYTES + 1)  # a hostile first line is not read whole
        except OSError:
            continue
        for event in decode_lines(first, str(path)) if first.endswith(b"\n") else ():
            if isinstance(event, RunStarted):
                jobs.setdefault(int(m.group(1)), event.job_id)
    return jobs


@dataclass(frozen=True, slots=True)
class Decision:
    """What every rank does at this step boundary: save (with the trigger), then maybe stop."""

    trigger: Trigger
    stop: bool
    requeue: bool
    reason: str
    save: bool = True
    """False after an anomaly: the model diverged, and a save would become the newest
    checkpoint; then only stop (and requeue) as decided."""


@dataclass
class _Pending:
    """Requests gathered between checks, consumed by the next agreement."""

    signal_code: int = _NO_SIGNAL
    manual: bool = False
    stop: bool = False
    anomaly: int = 0  # 1: stop, 2: roll back (stop and requeue)
    commands: list[control.Claimed] = field(default_factory=list)


class Session:
    """One attempt of one process of a training run."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        scheduler: Scheduler | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.config = config
        self.run = RunDir(config.run_dir)
        self.scheduler = scheduler or detect(requeue_command=config.requeue_command)
        self.rank = dist.rank() if rank is None else rank
        self.world_size = dist.world_size() if world_size is None else world_size
        launched = dist.launched_world_size()
        if world_size is None and self.world_size == 1 and launched > 1:
            # Without the process group every rank would decide alone: a signal on one rank
            # would stop it and leave the others hanging in their next collective.
            raise ConfigError(
                f"the launcher started {launched} ranks (WORLD_SIZE={launched}) but"
                " torch.distributed is not initialised: call"
                " torch.distributed.init_process_group() before creating ckptdash.Monitor,"
                " so that all ranks agree on when to save and stop"
            )
        self.host = socket.gethostname()
        self.attempt = dist.broadcast_int(self._attempt_number() if self.rank == 0 else 0)
        # Rank 0 writes the run's shared events; others only open a file if they must.
        self._writer: EventWriter | None = None
        if self.rank == 0:
            self._writer = EventWriter(self.run, attempt=self.attempt, rank=0, host=self.host)
        self.signals = SignalRecorder(list(config.signals))
        self._actions = {
            n.upper() if n.upper().startswith("SIG") else "SIG" + n.upper(): a
            for n, a in config.signals.items()
        }
        self.step = 0
        self.epoch: int | None = None
        # The one pending decision, read by Monitor and the Lightning callback alike.
        self.decision: Decision | None = None
        self.stop_reason: str | None = None
        self._pending = _Pending()
        self._anomalies = anomaly.AnomalyWatch(
            config.anomaly_metric, config.anomaly_factor, config.anomaly_window
        )
        self._in_flight: list[control.Claimed] = []
        self._countdown = 1
        self._check_every = 1
        self._last_check_step: int | None = None
        self._last_check_time = 0.0
        self._next_poll = 0.0
        self._next_heartbeat = 0.0
        self._max_steps: int | None = None
        self._started = False
        self._closed = False
        self._pulser: Pulser | None = None
        self._declared: set[str] = set()
        # Command ids this run has received in any attempt: a file copied back into the
        # inbox after done/ is rejected, never applied twice.
        self._seen_commands: set[str] = set()
        self._control_failures: set[tuple[str, str | None]] = set()

    # --- identity ------------------------------------------------------------------------

    @property
    def writer(self) -> EventWriter:
        """This process's event writer (opened on first use on ranks other than 0)."""
        if self._writer is None:
            self._writer = EventWriter(
                self.run, attempt=self.attempt, rank=self.rank, host=self.host
            )
        return self._writer

    def _attempt_number(self) -> int:
        known = self.scheduler.attempt
        files = self.run.event_files()
        if known is None:
            seen = [int(m.group(1)) for p in files if (m := _ATTEMPT_RE.match(p.name))]
            return max(seen) + 1 if seen else 0
        # The scheduler counts this job's restarts only. A new job submitted into a run
        # directory that earlier jobs used numbers its attempts after theirs; otherwise its
        # attempt 0 would merge with theirs in the history.
        job = self.scheduler.job_id
        others = [a for a, j in _attempt_jobs(files).items() if job is not None and j != job]
        return (max(others) + 1 if others else 0) + known

    def metadata(self, trigger: str) -> dict[str, Any]:
        """What a checkpoint carries under its ``ckptdash`` key."""
        return {
            "trigger": trigger,
            "attempt": self.attempt,
            "step": self.step,
            "scheduler": self.scheduler.name,
            "job_id": self.scheduler.job_id,
            "run": self.writer.run_id if self.rank == 0 else None,
        }

    # --- lifecycle -----------------------------------------------------------------------

    def start(self, *, max_steps: int | None = None, install_signals: bool = True) -> None:
        """Record the attempt, settle what a crashed attempt left, install handlers.

        Raises :class:`~ckptdash.errors.RunDirError` on every rank when another live
        job uses the run directory (see :mod:`ckptdash.train.guard`).
        """
        if self._started:
            return
        self._started = True
        self._max_steps = max_steps
        run_guard = RunGuard(
            Claimant(
                run=self.run,
                rank=self.rank,
                host=self.host,
                pid=os.getpid(),
                job_id=self.scheduler.job_id,
                scheduler=self.scheduler.name,
                attempt=self.attempt,
                stale_after_s=float(self.config.stale_after_s),
            )
        )
        if run_guard.refusal is not None:
            self._refuse(run_guard.refusal, recorded=False)
        started = None
        if self.rank == 0:
            started = self.writer.emit(
                RunStarted,
                scheduler=self.scheduler.name,
                job_id=self.scheduler.job_id,
                world_size=self.world_size,
                pid=os.getpid(),
                max_steps=max_steps,
                requeue_budget=self.config.max_attempts,
            )
        refusal = run_guard.confirm(started)
        if refusal is not None:
            self._refuse(refusal, recorded=True)
        if self.rank == 0 and started is not None and run_guard.view is not None:
            self._seen_commands = {
                cid
                for cid, c in run_guard.view.state.commands.items()
                if c.received_at is not None or c.resolved_at is not None or c.location == "claimed"
            }
            # Orphaned commands, interrupted saves.
            recover(
                self.run,
                self.writer,
                run_guard.view,
                attempt=self.attempt,
                started_at=started.t,
                complete=self.complete_command,
            )
            self.declare_checkpoint_dir(self.config.checkpoint_path)
        if install_signals:
            self.signals.install()
            self.announce_signals()
        self._last_check_time = time.monotonic()
        if self.config.pulse_interval_s > 0:
            self._pulser = Pulser(
                lambda: self.step,
                self.writer,
                period_s=self.config.pulse_interval_s,
                hung_after_s=self.config.hung_after_s,
            ).start()

    def _refuse(self, message: str, *, recorded: bool) -> None:
        """Refuse to start beside another live job (every rank): this session writes nothing
        more (Lightning calls teardown -> close() even when setup raised)."""
        writer = self._writer
        if writer is not None:
            if recorded:
                writer.emit(RunFailed, error=f"refused to start: {message}")
            writer.close()
            if not recorded:
                with contextlib.suppress(OSError):
                    if os.stat(writer.path).st_size == 0:
                        os.unlink(writer.path)  # nothing written: leave no trace
        self._closed = True
        raise RunDirError(message)

    def also_handle(self, name: str, action: SignalAction) -> None:
        """Handle signal ``name`` with ``action`` too (before the handlers are installed), e.g.
        the requeue signal another library set up (Lightning's SLURM auto-requeue)."""
        key = "SIG" + name.upper().removeprefix("SIG")
        if key not in self._actions:
            self._actions[key] = action
            self.signals.add(key)

    def announce_signals(self) -> str:
        """Say on stderr (rank 0), in one line, what each signal will do; returns the line."""
        plans = [f"{name} -> {self._signal_plan(name)}" for name in self._actions]
        if (
            self.scheduler.name == "slurm"
            and "SIGUSR1" not in self._actions
            and signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None)
        ):
            # SLURM's usual --signal=USR1 (Lightning's default) with nobody to catch it,
            # e.g. Lightning not detecting SLURM without --ntasks: the process just dies.
            plans.append(
                "SIGUSR1 -> nobody handles it: it ends the process unsaved (send USR2, or map"
                " it: TrainConfig(signals={'SIGUSR1': 'requeue', 'SIGTERM': 'terminate'}))"
            )
        line = "ckptdash: " + "; ".join(plans)
        if self.rank == 0:
            print(line, file=sys.stderr, flush=True)
        return line

    def _signal_plan(self, name: str) -> str:
        action = self._actions[name]
        if action == "ignore":
            plan = "record only"
        else:
            plan = "save at the next step boundary"
            if action == "requeue":
                plan += ", requeue " + self._requeue_plan()
            if self.config.exit_on_signal:
                plan += ", stop"
        owner = self.signals.previous_owner(signal_number(name))
        if owner is not None:
            who, chained = owner
            plan += f" (then {who}'s handler runs)" if chained else f" (replaces {who}'s handler)"
        return plan

    def _requeue_plan(self) -> str:
        if self.config.requeue == "off":
            return "off (TrainConfig.requeue='off')"
        if not self.scheduler.can_requeue:
            return f"impossible (no scheduler: {self.scheduler.name})"
        budget = self.config.max_attempts
        limit = f", at most {budget} attempts" if budget is not None else ""
        return f"by ckptdash ({self.scheduler.name} job {self.scheduler.job_id}{limit})"

    def declare_checkpoint_dir(self, path: str | os.PathLike[str]) -> None:
        """Record that this run saves checkpoints in the directory ``path`` (rank 0; once per
        directory per attempt). Only checkpoints inside the run directory or a declared
        directory count as this run's: a record naming any other file is reported invalid,
        never resumed from or pinned. Call it when a framework's checkpoint folder becomes
        known (ckptdash declares ``TrainConfig.checkpoint_path`` at start and the folder of
        every save it records)."""
        if self.rank != 0:
            return
        where = os.path.abspath(os.fspath(path))
        if where in self._declared:
            return
        self.writer.emit(CheckpointDirDeclared, step=self.step, path=where)
        self._declared.add(where)

    def complete_command(self, claimed: control.Claimed) -> None:
        """Move an answered command to ``done/``; a failure is an event, never the end of
        training (the outcome is already in the log, so the command is not applied again)."""
        try:
            control.complete(self.run, claimed)
        except (CkptDashError, OSError) as exc:
            self._control_failed(str(exc), claimed.id)

    def _control_failed(self, reason: str, command_id: str | None = None) -> None:
        """Report a control-channel failure: an event, and a warning for whoever reads stderr
        (once per reason and command in this attempt, however often it repeats)."""
        reason = control.safe_name(reason)
        if (reason, command_id) in self._control_failures:
            return
        self._control_failures.add((reason, command_id))
        warnings.warn(f"ckptdash: {reason}", RuntimeWarning, stacklevel=3)
        self.writer.emit(ControlFailed, step=self.step, reason=reason, command_id=command_id)

    def choose_resume(self) -> ResumeChoice:
        """Apply the resume rule on rank 0, tell every rank, and record the choice and skips."""
        choice = None
        if self.rank == 0:
            choice = choose_resume(self.run, validate=self.config.validate)
            for path, reason in choice.skipped:
                self.writer.emit(CheckpointInvalid, path=path, reason=reason)
        choice = dist.broadcast_object(choice)
        assert choice is not None
        return choice

    def check_given(self, path: str) -> str:
        """Validate a checkpoint the user chose to resume from (rank 0 judges, every rank gets
        the answer): the ``run_resumed`` reason, or :class:`~ckptdash.errors.CheckpointChoiceError`
        on every rank after recording why as ``checkpoint_invalid``."""
        verdict = None
        if self.rank == 0:
            verdict = judge_given(self.run, path, validate=self.config.validate)
            if verdict.error is not None:
                reason = f"given to resume from, refused: {verdict.problem}"
                self.writer.emit(CheckpointInvalid, path=verdict.path, reason=reason)
        verdict = dist.broadcast_object(verdict)
        assert verdict is not None
        if verdict.error is not None:
            raise CheckpointChoiceError(verdict.error)
        return verdict.reason

    def record_resumed(self, path: str, reason: str, step: int | None = None) -> None:
        """Record that this attempt loaded ``path`` (rank 0)."""
        if self.rank == 0:
            self.writer.emit(RunResumed, step=step, path=os.path.abspath(path), reason=reason)
            anomaly.clear_used_rollback_pin(self.run, path)
            if step is not None:  # what was saved before is the healthy reference for now
                self._anomalies.healthy_step = step

    def close(self, reason: str = "completed", error: BaseException | None = None) -> None:
        """End the attempt: answer unapplied commands, restore handlers, record the outcome."""
        if self._closed:
            return
        self._closed = True
        if self._pulser is not None:
            self._pulser.stop()
        if self.rank == 0:
            for claimed in self._in_flight + self._pending.commands:
                self._answer(
                    claimed, CommandExpired, reason="training ended before the command was applied"
                )
        if error is not None:
            # On every rank that saw it (others in their own file): when one rank fails,
            # rank 0 may never get to record anything.
            self.writer.emit(RunFailed, step=self.step, error=f"{type(error).__name__}: {error}")
        elif self.rank == 0:
            self.writer.emit(RunFinished, step=self.step, reason=self.stop_reason or reason)
        # Only now: a SIGTERM while the outcome is written (SLURM's, right after a requeue)
        # is recorded by our handler instead of ending the process first.
        self.signals.uninstall()
        if self._writer is not None:
            # Stays open: a user's trainer.save_checkpoint() after fit() is still recorded.
            self._writer.sync()

    def record_exception(self, exc: BaseException) -> None:
        """Record an exception that escaped training (before any exception save)."""
        if self._closed:
            return  # e.g. refused to start: this session writes nothing more
        self.writer.emit(
            ExceptionRaised,
            step=self.step,
            error_type=type(exc).__name__,
            message=str(exc)[:2000],
            traceback="".join(traceback.format_exception(exc))[-8000:],
        )

    # --- the step boundary -----------------------------------------------------------------

    def boundary(
        self,
        step: int,
        epoch: int | None = None,
        metrics: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> Decision | None:
        """Call after every optimizer step. Returns a decision on the steps where one is due.

        ``metrics`` may be a callable, read only when a heartbeat is due: reading
        Lightning's ``callback_metrics`` costs ~20 µs, more than the whole no-op path.
        """
        self.step = step
        self._countdown -= 1
        if self._countdown > 0 and not (self.world_size == 1 and self.signals.received):
            return None
        self.epoch = epoch
        return self._check(metrics)

    def check_now(
        self,
        step: int,
        epoch: int | None = None,
        metrics: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> Decision | None:
        """A check at this step boundary, whatever the countdown: for a single process that
        times its checks itself (every :attr:`check_period_s`, and on a signal) instead of
        calling :meth:`boundary` at every step. Ranks of a larger world must use
        :meth:`boundary`, whose countdown keeps their collectives on the same steps."""
        if self.world_size != 1:
            raise RuntimeError("check_now() is for a single process; use boundary() per step")
        self.step = step
        self.epoch = epoch
        return self._check(metrics)

    @property
    def check_period_s(self) -> float:
        """The longest a time-driven caller may wait between checks without delaying a
        command poll, a heartbeat or the agreement cadence."""
        c = self.config
        return min(c.agree_interval_s, c.poll_interval_s, c.heartbeat_interval_s)

    def _check(
        self, metrics: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None
    ) -> Decision | None:
        now = time.monotonic()
        self._retune(now)
        self._take_signals()
        if self.rank == 0:
            if now >= self._next_poll:
                self._next_poll = now + self.config.poll_interval_s
                self._take_commands()
            if now >= self._next_heartbeat:
                self._next_heartbeat = now + self.config.heartbeat_interval_s
                self._heartbeat(metrics() if callable(metrics) else metrics)
        pending = self._pending
        signal_code, manual, stop, check_every, bad = dist.agree_max(
            [
                pending.signal_code,
                int(pending.manual),
                int(pending.stop),
                self._check_every,
                pending.anomaly,
            ]
        )
        self._check_every = max(1, check_every)
        self._countdown = self._check_every
        self._in_flight.extend(pending.commands)
        self._pending = _Pending()
        if bad:  # before a signal's save: saving a diverged model would make it the newest
            decision = Decision(
                trigger="exception", stop=True, requeue=bad == 2, reason="anomaly", save=False
            )
        elif signal_code != _NO_SIGNAL:
            requeue = signal_code == _REQUEUE
            decision = Decision(
                trigger="signal",
                stop=self.config.exit_on_signal,
                requeue=requeue,
                reason="preempted" if requeue else "terminated",
            )
        elif manual or stop:
            decision = Decision(
                trigger="manual", stop=bool(stop), requeue=False, reason="stopped by command"
            )
        else:
            return None
        # Pending until a save answers it (after_save/save_failed): a check that finds
        # nothing new leaves it for the caller's save; a new decision replaces it.
        self.decision = decision
        return decision

    def _retune(self, now: float) -> None:
        # Derive the number of steps between checks from the measured step time, so the
        # collective runs about once per agree_interval_s rather than once per step.
        if self._last_check_step is not None and self.step > self._last_check_step:
            step_time = (now - self._last_check_time) / (self.step - self._last_check_step)
            target = self.config.agree_interval_s / max(step_time, 1e-6)
            self._check_every = int(min(max(target, 1), 10_000))
        self._last_check_step = self.step
        self._last_check_time = now

    def _take_signals(self) -> None:
        for received in self.signals.take():
            action = self._actions.get(received.name, "ignore")
            self._pending.signal_code = max(self._pending.signal_code, _ACTION_CODE[action])
            # Every rank records what it received (non-zero ranks in their own file):
            # the dashboard shows which ranks got the signal.
            self.writer.emit(
                SignalReceived, t=received.t, step=self.step, signal=received.name, action=action
            )

    def _take_commands(self) -> None:
        try:
            # A file that cannot be claimed stays pending: an event says so, once.
            claimed_now = control.claim(self.run, on_problem=self._control_failed)
        except (CkptDashError, OSError) as exc:
            # The inbox being unusable must not end training: an event says why.
            self._control_failed(f"cannot take commands: {exc}")
            return
        for claimed in claimed_now:
            if claimed.id in self._seen_commands:
                self._answer(
                    claimed,
                    CommandRejected,
                    reason=f"replayed: command {claimed.id} was already received in this run;"
                    " a command is applied at most once (issue a new one)",
                )
                continue
            self._seen_commands.add(claimed.id)
            self.writer.emit(
                CommandReceived, step=self.step, command_id=claimed.id, command=claimed.command_name
            )
            if claimed.error is not None:
                self._answer(claimed, CommandRejected, reason=claimed.error)
            elif claimed.expired:
                self._answer(claimed, CommandExpired, reason="expired before the job saw it")
            else:
                self._pending.manual = True
                self._pending.stop |= claimed.command_name == "stop_after_save"
                self._pending.commands.append(claimed)

    def _heartbeat(self, metrics: Mapping[str, Any] | None) -> None:
        numeric = _numeric(metrics)
        self.writer.emit(
            Heartbeat,
            step=self.step,
            epoch=self.epoch,
            metrics=numeric,
            time_left_s=self.scheduler.time_left_s(),
        )
        found = self._anomalies.check(self.step, numeric)
        if found is not None:
            self._on_anomaly(found)

    def _on_anomaly(self, found: anomaly.Anomaly) -> None:
        """Record it; for stop/rollback, ask every rank to stop at this check (rank 0)."""
        action = self.config.on_anomaly
        reason, pinned = found.reason, None
        if action == "rollback":
            try:
                target = anomaly.rollback_target(self.run, found)
                if target is not None:
                    anomaly.pin_for_rollback(self.run, target.path, found.step)
                    pinned = target.path
            except Exception as exc:  # no pin: stop without requeue rather than resume diverged
                reason += f"; could not pin a checkpoint: {exc}"
            if pinned is None and "could not pin" not in reason:
                reason += "; no valid checkpoint before it to roll back to: stopping only"
        self.writer.emit(
            AnomalyDetected,
            step=found.step,
            metric=found.metric,
            value=found.value,
            reason=reason,
            action=action,
            pinned=pinned,
        )
        if action != "record":
            self._pending.anomaly = 2 if pinned is not None else 1

    def heartbeat(self, metrics: Mapping[str, Any] | None = None) -> None:
        """Write a heartbeat now (rank 0), e.g. at the end of an epoch."""
        if self.rank == 0:
            self._heartbeat(metrics)

    # --- after the save ----------------------------------------------------------------------

    def after_save(self, saved: CheckpointSaved | None, path: str | None = None) -> None:
        """Answer the commands that asked for this save, then requeue/stop as decided."""
        decision = self.decision
        self.decision = None
        where = saved.path if saved is not None else (path or "")
        if self.rank == 0:
            for claimed in self._in_flight:
                self._answer(claimed, CommandApplied, detail=where)
        self._in_flight = []
        if decision is None:
            return
        if decision.requeue and self.rank == 0:
            self._requeue()
        if decision.stop:
            self.stop_reason = decision.reason
            if decision.trigger == "signal":
                SIGNAL_STOPS.append(decision.reason)

    def save_failed(self, error: BaseException) -> None:
        """A decided save failed: reject the commands waiting on it, keep training."""
        self.decision = None
        if self.rank == 0:
            for claimed in self._in_flight:
                self._answer(claimed, CommandRejected, reason=f"save failed: {error}")
        self._in_flight = []

    def _requeue(self) -> None:
        reason = self._requeue_refusal()
        if reason is not None:
            self.writer.emit(RequeueSkipped, step=self.step, reason=reason)
            return
        result = self.scheduler.requeue()
        if result.ok:
            self.writer.emit(
                RequeueIssued, step=self.step, job_id=self.scheduler.job_id, command=result.command
            )
        else:
            self.writer.emit(
                RequeueSkipped,
                step=self.step,
                reason=f"requeue command failed (`{result.command}` exit {result.returncode}):"
                f" {result.output}",
            )

    def _requeue_refusal(self) -> str | None:
        if self.config.requeue == "off":
            return "requeue is off in the configuration (TrainConfig.requeue='off')"
        try:
            settings = control.read_settings(self.run)
        except Exception as exc:  # a broken settings file must not stop the save path
            return f"settings unreadable, not requeueing to be safe: {exc}"
        if settings.requeue_suspended:
            who = f" by {settings.updated_by}" if settings.updated_by else ""
            return f"suspended{who} in {self.run.settings}"
        budget = self.config.max_attempts
        # The budget is per job: its own restarts, not the attempts of earlier jobs in the run.
        own = self.scheduler.attempt
        attempt = own if own is not None else self.attempt
        if budget is not None and attempt + 1 >= budget:
            return (
                f"requeue budget reached: attempt {attempt + 1} of {budget}"
                " (raise TrainConfig.max_attempts to allow more)"
            )
        if not self.scheduler.can_requeue:
            return f"no scheduler to requeue with ({self.scheduler.name})"
        return None

    def _answer(self, claimed: control.Claimed, kind: type[Any], **fields: Any) -> None:
        self.writer.emit(
            kind, step=self.step, command_id=claimed.id, command=claimed.command_name, **fields
        )
        self.complete_command(claimed)


def _numeric(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        try:
            out[str(name)] = float(value)
        except (TypeError, ValueError):
            continue  # a metric that is not a number is left out of heartbeats
    return out
