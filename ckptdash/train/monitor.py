"""ckptdash for a plain PyTorch loop.

with ckptdash.Monitor("runs/exp1", max_steps=1000) as monitor:
    state = monitor.load()                      # the resume rule's choice, or None
    start = state["step"] + 1 if state else 0
    for step in range(start, 1000):
        loss = train_step()
        monitor.step(step, loss=loss)
        if monitor.should_save:                 # signal, Save now, Stop after save
            monitor.save({"model": model.state_dict(), "step": step})
        if monitor.should_stop:
            break
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

from ckptdash.events import CheckpointSaved, Trigger
from ckptdash.resume import ResumeChoice
from ckptdash.train.config import TrainConfig
from ckptdash.train.saving import META_KEY, save_atomic
from ckptdash.train.scheduler import Scheduler
from ckptdash.train.session import Decision, Session


class Monitor:
    """Signals, commands, requeue, atomic saves and the resume rule for a hand-written loop.

    ``run_dir`` and any :class:`TrainConfig` field may be passed as keywords,
    or a whole ``config``. Usable as a context manager: leaving the block
    records how the attempt ended (an exception is recorded as ``run_failed``).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        config: TrainConfig | None = None,
        max_steps: int | None = None,
        scheduler: Scheduler | None = None,
        install_signals: bool = True,
        **options: Any,
    ) -> None:
        if config is None:
            if run_dir is None:
                raise TypeError("Monitor needs a run_dir (or a TrainConfig as config=)")
            config = TrainConfig(run_dir=run_dir, **options)
        self.config = config
        self.session = Session(config, scheduler=scheduler)
        self.session.start(max_steps=max_steps, install_signals=install_signals)
        self._resume: ResumeChoice | None = None
        self._decision: Decision | None = None
        self._stop = False

    # --- resume ------------------------------------------------------------------------------

    @property
    def resume_choice(self) -> ResumeChoice:
        """The resume rule's answer for this attempt (computed once, agreed by all ranks)."""
        if self._resume is None:
            self._resume = self.session.choose_resume()
        return self._resume

    def load(self, map_location: Any = "cpu", weights_only: bool = True) -> Any:
        """Load the checkpoint the resume rule chose and record it; None on a fresh start.

        ``weights_only=True`` (the default) lets ``torch.load`` rebuild only tensors, numbers,
        strings and containers: a checkpoint file someone swapped for a malicious pickle
        cannot run code. Pass ``weights_only=False`` only for files you trust that hold
        other objects (it unpickles arbitrary classes).
        """
        import torch

        choice = self.resume_choice
        if choice.path is None:
            return None
        obj = torch.load(choice.path, map_location=map_location, weights_only=weights_only)
        self.session.record_resumed(choice.path, choice.reason, step=choice.step)
        return obj

    # --- the loop ----------------------------------------------------------------------------

    def step(self, step: int, *, epoch: int | None = None, **metrics: Any) -> Decision | None:
        """Call once per optimizer step, after it. Cheap unless a check is due."""
        decision = self.session.boundary(step, epoch, metrics)
        if decision is not None:
            self._decision = decision
        return decision

    @property
    def should_save(self) -> bool:
        """A save was decided (signal or command): call :meth:`save` before the next step."""
        return self._decision is not None

    @property
    def should_stop(self) -> bool:
        """Training should end now (after a signal save, or a Stop after save command)."""
        return self._stop

    @property
    def attempt(self) -> int:
        return self.session.attempt

    def save(
        self,
        state: Any,
        path: str | os.PathLike[str] | None = None,
        *,
        trigger: Trigger | None = None,
        all_ranks: bool = False,
    ) -> CheckpointSaved | None:
        """Save ``state`` atomically with ``torch.save`` and record it.

        ``trigger`` defaults to the pending decision's (``signal``/``manual``) or
        ``api``. ``path`` defaults to ``checkpoints/step=N.ckpt`` in the run
        directory. A dict ``state`` gets a ``ckptdash`` key with trigger,
        attempt, scheduler and job id. Only rank 0 writes unless ``all_ranks``.
        """
        session = self.session
        decision = self._decision
        trig: Trigger = trigger or (decision.trigger if decision else "api")
        target = Path(path) if path else self.config.checkpoint_path / f"step={session.step}.ckpt"
        if isinstance(state, dict):
            state = {**state, META_KEY: session.metadata(trig)}
        saved = None
        if session.rank == 0 or all_ranks:
            session.declare_checkpoint_dir(os.path.dirname(os.path.abspath(target)))
            try:
                saved = save_atomic(
                    session.writer if session.rank == 0 else None,
                    state,
                    os.path.abspath(target),
                    trigger=trig,
                    step=session.step,
                    epoch=session.epoch,
                )
            except BaseException as exc:
                if decision is not None:
                    self._decision = None
                    session.save_failed(exc)
                raise
        if decision is not None and (trigger is None or trigger == decision.trigger):
            self._decision = None
            session.after_save(saved, str(target))
            self._stop = self._stop or decision.stop
        return saved

    def stop(self) -> None:
        """Ask the loop to end (sets :attr:`should_stop`)."""
        self._stop = True

    def close(self, error: BaseException | None = None) -> None:
        """Record how the attempt ended and restore the signal handlers."""
        if error is not None and self.session.rank == 0:
            self.session.record_exception(error)
        self.session.close(error=error)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, KeyboardInterrupt):
            self.session.close(reason="interrupted")
        else:
            self.close(exc)
