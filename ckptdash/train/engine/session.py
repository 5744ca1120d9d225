"""The training-side engine shared by :class:`~ckptdash.Monitor` and the Lightning callback.

At each step boundary the loop calls :meth:`Session.boundary`. Almost always it returns ``None``
after decrementing a counter (the hot path). Every ``check_every`` steps — a count derived from
the measured step time so that a check happens about every ``agree_interval_s`` — it:

1. takes the signals the record-only handlers saw;
2. on rank 0, claims commands from the inbox (at most every ``poll_interval_s``)
   and writes a heartbeat (at most every ``heartbeat_interval_s``);
3. with several ranks, agrees on what to do through one small ``all_reduce``,
   so every rank saves the same step even if only one rank got the signal;
4. returns a :class:`Decision`: save with which trigger, then requeue or stop.

The caller saves; :meth:`Session.after_save` answers the commands with the checkpoint path and
runs the requeue policy (read fresh from the settings then: a click just before preemption counts).
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from ckptdash import control
from ckptdash.events import (
    CheckpointDirDeclared,
    CheckpointSaved,
    CommandApplied,
    CommandExpired,
    CommandRejected,
    ExceptionRaised,
    Heartbeat,
    RunFailed,
    RunFinished,
    RunResumed,
    RunStarted,
    SignalReceived,
)
from ckptdash.resume import ResumeChoice
from ckptdash.rundir import RunDir, door
from ckptdash.rundir.writer import EventWriter
from ckptdash.schedulers import detect
from ckptdash.schedulers.base import Scheduler
from ckptdash.train.config import SignalAction, TrainConfig
from ckptdash.train.ending import crash_loop, exit_status, requeue
from ckptdash.train.engine import dist
from ckptdash.train.engine.announce import announce_stream, announcement
from ckptdash.train.engine.cadence import Cadence
from ckptdash.train.engine.commands import Commands
from ckptdash.train.engine.decision import ACTION_CODE, Decision, Pending, decide
from ckptdash.train.engine.intake import SignalIntake
from ckptdash.train.health import anomaly
from ckptdash.train.health.pulse import Pulser
from ckptdash.train.starting import resuming
from ckptdash.train.starting.attempts import attempt_number
from ckptdash.train.starting.fresh import consume_fresh_request, fresh_start
from ckptdash.train.starting.guard import Claimant, RunGuard, refuse_to_start
from ckptdash.train.starting.recovery import recover

SIGNAL_STOPS: list[str] = []
"""Why each signal stop in this process stopped training (``preempted``, ``terminated``): a
launcher helper must then not report the function's early return as a final result."""


LATE_REQUEUE_WINDOW_S: Final = 2.0
"""How long an attempt stopped by a terminate signal waits for a requeue signal before it
ends (see ``Session._requeue_if_asked_since_terminating``); well inside SLURM's KillWait
(30 s by default) between SIGTERM and SIGKILL."""


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
        if world_size is None:
            dist.check_initialised(self.world_size)
        self.host = socket.gethostname()
        door.secure_attempt(self.run.root, say=self.rank == 0)  # the owner's alone, or refused
        self.attempt = dist.broadcast_int(
            attempt_number(self.run, self.scheduler) if self.rank == 0 else 0
        )
        # Rank 0 writes the run's shared events; others only open a file if they must.
        self._writer: EventWriter | None = None
        if self.rank == 0:
            self._writer = EventWriter(self.run, attempt=self.attempt, rank=0, host=self.host)
        self._intake = SignalIntake(self.scheduler.signals, config.signals)
        self._actions = self._intake.actions
        self.signals = self._intake.recorder
        self.step = 0
        self.epoch: int | None = None
        # The one pending decision, read by Monitor and the Lightning callback alike.
        self.decision: Decision | None = None
        self.stop_reason: str | None = None
        self._pending = Pending()
        self._anomalies = anomaly.AnomalyWatch(
            config.anomaly_metric, config.anomaly_factor, config.anomaly_window
        )
        self.commands = Commands(self.run, lambda: self.writer)
        self._cadence = Cadence(
            config.agree_interval_s, config.poll_interval_s, config.heartbeat_interval_s
        )
        self._max_steps: int | None = None
        self._started = False
        self._closed = False
        self._pulser: Pulser | None = None
        self._declared: set[str] = set()
        self.earlier_step: int | None = None
        """The highest step an earlier attempt of the run was seen at (rank 0, from start on):
        what an append-only logger may already hold beyond this attempt's resume point."""

    # --- identity ------------------------------------------------------------------------

    @property
    def writer(self) -> EventWriter:
        """This process's event writer (opened on first use on ranks other than 0)."""
        if self._writer is None:
            self._writer = EventWriter(
                self.run, attempt=self.attempt, rank=self.rank, host=self.host
            )
        return self._writer

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
        job uses the run directory (see :mod:`ckptdash.train.starting.guard`).
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
        fresh, asked = "", False
        if self.rank == 0 and run_guard.view is not None:
            fresh, asked = fresh_start(self.run, self.config, run_guard.view.state)
        if self.rank == 0:
            started = self.writer.emit(
                RunStarted,
                scheduler=self.scheduler.name,
                job_id=self.scheduler.job_id,
                world_size=self.world_size,
                pid=os.getpid(),
                max_steps=max_steps,
                requeue_budget=self.config.max_attempts,
                fresh=fresh,
            )
        refusal = run_guard.confirm(started)
        if refusal is not None:
            self._refuse(refusal, recorded=True)
        if asked:
            consume_fresh_request(self.run)
        if self.rank == 0 and started is not None and run_guard.view is not None:
            self.commands.seen = run_guard.view.received_commands()
            self.earlier_step = run_guard.view.highest_step_before(self.attempt)
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
        self._cadence.start(time.monotonic(), max_steps)
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
        self._closed = True
        refuse_to_start(self._writer, message, recorded=recorded)

    def also_handle(self, name: str, action: SignalAction) -> None:
        """Handle signal ``name`` with ``action`` too (before the handlers are installed), e.g.
        the requeue signal another library set up (Lightning's SLURM auto-requeue)."""
        self._intake.add(name, action)

    def announce_signals(self) -> str:
        """Say on stderr (rank 0; stdout in a notebook), in one line, what each signal will do;
        returns the line."""
        line = announcement(self._actions, self.config, self.scheduler, self.signals)
        line += self._intake.agent_plan()
        if self.rank == 0:
            print(line, file=announce_stream(), flush=True)
        return line

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
        self.commands.complete(claimed, self.step)

    def choose_resume(self, exclude: Collection[str] = ()) -> ResumeChoice:
        """The resume rule on rank 0 (less ``exclude``), told to every rank, skips recorded."""
        lead = self.writer if self.rank == 0 else None
        return resuming.choose(self.run, lead, validate=self.config.validate, exclude=exclude)

    def check_given(self, path: str) -> tuple[str, str]:
        """Validate a checkpoint the user chose to resume from (rank 0 judges, every rank gets
        the answer): the file to load (``path``, or the checkpoint a link points at) and the
        ``run_resumed`` reason, or :class:`~ckptdash.errors.CheckpointChoiceError` on every
        rank after recording why as ``checkpoint_invalid``."""
        lead = self.writer if self.rank == 0 else None
        return resuming.check_given(self.run, lead, path, validate=self.config.validate)

    def record_resumed(self, path: str, reason: str, step: int | None = None) -> None:
        """Record that this attempt loaded ``path`` (rank 0)."""
        if self.rank == 0:
            reason += anomaly.consume_pin(self.run, path)
            self.writer.emit(RunResumed, step=step, path=os.path.abspath(path), reason=reason)
            if step is not None:  # what was saved before is the healthy reference for now
                self._anomalies.healthy_step = step

    def close(
        self,
        reason: str = "completed",
        error: BaseException | None = None,
        failure: str | None = None,
    ) -> None:
        """End the attempt: answer unapplied commands, restore handlers, record the outcome.

        ``failure`` is what ``run_failed`` says for ``error`` (default: its type and message).
        """
        if self._closed:
            return
        self._closed = True
        if self._pulser is not None:
            self._pulser.stop()
        if self.rank == 0:
            self.commands.answer_waiting(
                self.step,
                CommandExpired,
                also=self._pending.commands,
                reason="training ended before the command was applied",
            )
        # A signal since the last agreement (after the last step, or during it without a
        # known max_steps) has nothing left to act on, but is recorded on the rank it reached.
        self._take_signals()
        if error is not None:
            # On every rank that saw it (others in their own file): when one rank fails,
            # rank 0 may never get to record anything.
            text = failure or f"{type(error).__name__}: {error}"
            self.writer.emit(RunFailed, step=self.step, error=text)
            if self.rank == 0:
                crash_loop.respond(self.run, self.writer, self.step)
        else:
            self._requeue_if_asked_since_terminating()
            if self.rank == 0:
                self.writer.emit(RunFinished, step=self.step, reason=self.stop_reason or reason)
        # Only now: a SIGTERM while the outcome is written (SLURM's, right after a requeue)
        # is recorded by our handler instead of ending the process first.
        self.release_signals()
        if self._writer is not None:
            # Stays open: a user's trainer.save_checkpoint() after fit() is still recorded.
            self._writer.sync()
            exit_status.request(self.scheduler.exit_status)  # Grid Engine's 99, else None

    def _requeue_if_asked_since_terminating(self) -> None:
        """A terminate signal followed by a requeue signal before the attempt ends is one
        preemption (:func:`~ckptdash.train.ending.requeue.late_requeue_signal`): requeue after the
        one save. Every rank waits; rank 0 requeues."""
        if self.stop_reason != "terminated" or not self.scheduler.can_requeue:
            return
        if not self._intake.may_requeue:
            return
        if not requeue.late_requeue_signal(self._late_signal_code, LATE_REQUEUE_WINDOW_S):
            return
        cancelled = self.rank == 0 and self._requeue()
        self.stop_reason = "terminated" if cancelled else "preempted"

    def _late_signal_code(self) -> int:
        self._take_signals()
        return self._pending.signal_code

    def _requeue(self) -> bool:
        """Requeue the job unless the policy refuses; record which (rank 0). True: the
        scheduler is cancelling the job instead (saved, not requeued)."""
        return requeue.requeue(
            self.writer,
            self.config,
            self.run,
            self.scheduler,
            attempt=self.attempt,
            step=self.step,
        )

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
        if not self._cadence.due(step) and not (self.world_size == 1 and self.signals.received):
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
        self._cadence.retune(self.step, now)
        self._take_signals()
        if self.rank == 0:
            if self._cadence.poll_due(now):
                self._take_commands()
            if self._cadence.heartbeat_due(now):
                self._heartbeat(metrics() if callable(metrics) else metrics)
        pending = self._pending
        signal_code, manual, stop, check_every, bad = dist.agree_max(
            [
                pending.signal_code,
                int(pending.manual),
                int(pending.stop),
                self._cadence.check_every,
                pending.anomaly,
            ]
        )
        self._cadence.agreed(check_every)
        self.commands.waiting.extend(pending.commands)
        self._pending = Pending()
        decision = decide(signal_code, manual, stop, bad, exit_on_signal=self.config.exit_on_signal)
        if decision is not None:
            # Pending until a save answers it (after_save/save_failed): a check that finds
            # nothing new leaves it for the caller's save; a new decision replaces it.
            self.decision = decision
        return decision

    def release_signals(self) -> None:
        """Put the handlers from before back, recording every signal they still hold."""
        self.signals.uninstall()
        self._take_signals()

    def _take_signals(self) -> None:
        for got in self._intake.take():  # signals, and a launcher agent gone
            self._pending.signal_code = max(self._pending.signal_code, ACTION_CODE[got.action])
            # Every rank records what it received (non-zero ranks in their own file):
            # the dashboard shows which ranks got the signal.
            self.writer.emit(
                SignalReceived, t=got.t, step=self.step, signal=got.name, action=got.action
            )

    def _take_commands(self) -> None:
        for claimed in self.commands.claim(self.step):
            self._pending.manual = True
            self._pending.stop |= claimed.command_name == "stop_after_save"
            self._pending.commands.append(claimed)

    def _heartbeat(self, metrics: Mapping[str, Any] | None) -> None:
        numeric = anomaly.numeric(metrics)
        self.writer.emit(
            Heartbeat,
            step=self.step,
            epoch=self.epoch,
            metrics=numeric,
            time_left_s=self.scheduler.time_left_s(),
        )
        found = self._anomalies.check(self.step, numeric)
        if found is not None:
            # Rank 0: for stop/rollback, every rank stops at this check.
            code = anomaly.respond(self.run, self.writer, found, self.config.on_anomaly)
            if code:
                self._pending.anomaly = code

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
        self.commands.answer_waiting(self.step, CommandApplied, detail=where)
        if decision is None:
            return
        cancelled = decision.requeue and self.rank == 0 and self._requeue()
        if decision.stop:
            self.stop_reason = "terminated" if cancelled else decision.reason
            if decision.trigger == "signal":
                SIGNAL_STOPS.append(decision.reason)

    def save_failed(self, error: BaseException) -> None:
        """A decided save failed: reject the commands waiting on it, keep training."""
        self.decision = None
        self.commands.answer_waiting(self.step, CommandRejected, reason=f"save failed: {error}")
