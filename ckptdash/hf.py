"""ckptdash for the Hugging Face Trainer: one callback, one resume line.

    trainer = Trainer(..., callbacks=[CkptDashCallback("runs/exp1")])
    trainer.train(resume_from_checkpoint=ckptdash.resume_path("runs/exp1"))

Every ``checkpoint-N`` the Trainer writes is recorded (trigger ``periodic``;
``signal``/``manual`` when ckptdash asked for it; ``final`` at ``max_steps``)
with a manifest of its files, so ``resume_path`` returns the newest checkpoint
whose every file is intact. ``save_total_limit`` rotations are recorded as
removed. A preemption signal or a Save now / Stop after save command sets
``control.should_save`` (and ``should_training_stop`` where the policy says so)
at a step boundary all ranks agree on; the Trainer saves, ckptdash records it
and requeues per policy, and ``train()`` returns normally. Heartbeats carry the
metrics the Trainer logs.

Leave ``TrainingArguments(enable_jit_checkpoint=...)`` off: its SIGTERM save
bypasses the callbacks (nothing would record it). Put ``SIGTERM`` in
``TrainConfig.signals`` instead if your cluster sends it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ckptdash.events import Trigger
from ckptdash.rundir import RunDir
from ckptdash.train.config import TrainConfig
from ckptdash.train.ending import submitit_job
from ckptdash.train.monitor import Monitor
from ckptdash.train.tracking import hf_loggers, loggers

__all__ = ["CkptDashCallback"]

_PREFIX = "checkpoint-"
SAVE_ONLY_MODEL = "save_only_model=True: no optimizer, scheduler or RNG state (HF cannot resume it)"


class CkptDashCallback(TrainerCallback):
    """Records the Trainer's checkpoints and steers its saves from signals and commands.

    ``run_dir`` and any :class:`~ckptdash.train.config.TrainConfig` field may be
    passed as keywords, or a whole ``config``. The attempt starts at
    ``on_train_begin`` and ends at ``on_train_end``.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        config: TrainConfig | None = None,
        **options: Any,
    ) -> None:
        self.config = TrainConfig.given(run_dir, config, options, who="CkptDashCallback")
        self.monitor: Monitor | None = None
        self._logs: dict[str, Any] = {}
        self._known: set[Path] = set()
        self._output_dir: Path | None = None
        self._preempted = False
        self._drops: list[loggers.DropUntil] = []
        if self.config.continue_loggers:  # before the Trainer builds its reporting callbacks
            hf_loggers.name_runs(RunDir(self.config.run_dir))

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.config.continue_loggers and state.is_world_process_zero:
            hf_loggers.purge_tensorboard(RunDir(self.config.run_dir), args)

    # --- attempt lifecycle ----------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if getattr(args, "enable_jit_checkpoint", False):
            warnings.warn(
                "ckptdash: TrainingArguments(enable_jit_checkpoint=True) saves on SIGTERM without"
                " calling the callbacks, so ckptdash cannot record that save; turn it off and"
                " list SIGTERM in the ckptdash signals instead",
                RuntimeWarning,
                stacklevel=2,
            )
        if getattr(args, "save_only_model", False) and state.is_world_process_zero:
            warnings.warn(
                "ckptdash: TrainingArguments(save_only_model=True): HF cannot resume training"
                " from these checkpoints, so ckptdash records them as artifacts and never"
                " resumes from one (a preemption restarts from the newest full checkpoint, or"
                " from scratch); turn it off for checkpoints that resume",
                RuntimeWarning,
                stacklevel=2,
            )
        monitor = self.monitor = Monitor(config=self.config, max_steps=state.max_steps or None)
        # train() returns after a preemption and the submitted function goes on.
        lead = monitor.session.rank == 0
        submitit_job.warn_if_unwrapped("ckptdash.hf.CkptDashCallback", lead=lead)
        out = self._output_dir = Path(os.path.abspath(args.output_dir))
        monitor.declare_checkpoint_dir(out)
        self._known = _checkpoints_in(out)
        choice = monitor.resume_choice  # records the candidates it skipped, and why
        step = state.global_step
        if step > 0:  # the Trainer loaded a checkpoint before this hook
            if choice.path is not None and choice.step == step:
                monitor.session.record_resumed(choice.path, choice.reason, step=step)
            else:
                path = str(out / f"{_PREFIX}{step}")
                monitor.session.record_resumed(
                    path, "given to train(resume_from_checkpoint=...)", step=step
                )
        if self.config.continue_loggers and state.is_world_process_zero:
            # The reporting callbacks began before us.
            self._drops = hf_loggers.record_runs(monitor, args, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        monitor, self.monitor = self.monitor, None
        for drop in self._drops:
            drop.restore()
        if self.config.continue_loggers:
            hf_loggers.forget_runs()  # the reporting callbacks have read them by now
        if monitor is None:
            return
        monitor.session.step = state.global_step
        monitor.session.heartbeat(self._logs)
        self._preempted = monitor.preempted
        monitor.close()

    @property
    def preempted(self) -> bool:
        """After ``trainer.train()`` returned: a signal stopped it (ckptdash saved, and
        requeued where the policy allowed), so training did not finish. Code after
        ``train()`` should then exit instead of evaluating or saving a final model::

            trainer.train(resume_from_checkpoint=ckptdash.resume_path(run_dir))
            if callback.preempted:
                sys.exit(0)  # the requeued job goes on from the signal save
        """
        monitor = self.monitor
        return monitor.preempted if monitor is not None else self._preempted

    def record_failure(self, error: BaseException) -> None:
        """Record that ``train()`` raised (the Trainer tells no callback): ``exception`` and
        ``run_failed`` instead of an attempt that looks lost. Call it in an ``except``::

            try:
                trainer.train(resume_from_checkpoint=ckptdash.resume_path(run_dir))
            except BaseException as exc:
                callback.record_failure(exc)
                raise
        """
        monitor, self.monitor = self.monitor, None
        for drop in self._drops:
            drop.restore()
        if monitor is not None:
            monitor.close(error)

    # --- the step boundary ------------------------------------------------------------------

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        monitor.step(state.global_step, epoch=_epoch(state), metrics=self._metrics)
        if monitor.should_save:
            # Asked again at every step until a save answers it: with save_strategy="best"
            # an evaluation at this step may overwrite the flag. The stop comes in on_save,
            # after the save, so training never stops without it.
            control.should_save = True
        if control.should_save and args.save_strategy != "best" and self._output_dir is not None:
            # The Trainer writes checkpoint-N in place right after this hook: announce it, so
            # that a kill during the write is recorded as an interrupted save next attempt.
            # ("best" decides after an evaluation whether to save: nothing to announce yet.)
            monitor.record_started(
                self._output_dir / f"{_PREFIX}{state.global_step}",
                trigger=self._trigger_for(monitor, state),
            )

    def _metrics(self) -> dict[str, Any]:
        return self._logs

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if logs:
            self._logs = {**self._logs, **logs}

    @staticmethod
    def _trigger_for(monitor: Monitor, state: Any) -> Trigger | None:
        """None (the pending decision's trigger) when ckptdash asked for this save; else
        ``final`` at ``max_steps`` and ``periodic`` before."""
        if monitor.should_save:
            return None
        return "final" if state.max_steps and state.global_step >= state.max_steps else "periodic"

    # --- saves, written by the Trainer ------------------------------------------------------

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        monitor, out = self.monitor, self._output_dir
        if monitor is None or out is None:
            return
        path = out / f"{_PREFIX}{state.global_step}"
        resumable: bool | str = True
        if getattr(args, "save_only_model", False):  # HF: such a checkpoint cannot resume
            resumable = SAVE_ONLY_MODEL
        trigger = self._trigger_for(monitor, state)
        monitor.record(path, trigger=trigger, step=state.global_step, resumable=resumable)
        if monitor.should_stop:
            control.should_training_stop = True
        if monitor.session.rank == 0:
            now = _checkpoints_in(out)
            why = f"rotated by the Trainer (save_total_limit={args.save_total_limit})"
            for gone in sorted(self._known - now):
                monitor.record_removed(gone, reason=why)
            self._known = now


def _checkpoints_in(folder: Path) -> set[Path]:
    try:
        names = [p for p in folder.iterdir() if p.name.startswith(_PREFIX)]
        return {p for p in names if p.name[len(_PREFIX) :].isdigit()}
    except OSError:
        return set()


def _epoch(state: Any) -> int | None:
    epoch = getattr(state, "epoch", None)
    return int(epoch) if epoch is not None else None
