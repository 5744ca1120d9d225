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

``monitor.save_async(state)`` saves in the background instead (see docs/async.md).

Why it runs over 500 lines: it is one class, the whole public surface of a plain loop (load,
step, save and save_async, the records of someone else's saves, close), each method a few
lines that hand over to the engine, ``checkpoints/`` and ``tracking/``; splitting the class
would only scatter one idea.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from ckptdash.errors import CkptDashError, SaveError
from ckptdash.events import CheckpointRemoved, CheckpointSaved, CheckpointStarted, Trigger
from ckptdash.resume import ResumeChoice
from ckptdash.schedulers.base import Scheduler
from ckptdash.train.checkpoints import publish
from ckptdash.train.checkpoints.artifacts import artifact_of
from ckptdash.train.checkpoints.async_save import AsyncSaver, SaveHandle
from ckptdash.train.checkpoints.misfit import MISFIT_ERRORS, misfit_message, older_resumable
from ckptdash.train.checkpoints.saving import META_KEY, durable_existing, record_save, save_atomic
from ckptdash.train.config import TrainConfig
from ckptdash.train.ending import submitit_job
from ckptdash.train.ending.excepthook import ExceptHook
from ckptdash.train.engine import dist
from ckptdash.train.engine.decision import Decision
from ckptdash.train.engine.session import SIGNAL_STOPS, Session
from ckptdash.train.tracking.logger_runs import LoggerRuns


class Monitor:
    """Signals, commands, requeue, atomic saves and the resume rule for a hand-written loop.

    ``run_dir`` and any :class:`TrainConfig` field may be passed as keywords,
    or a whole ``config``. Usable as a context manager: leaving the block
    records how the attempt ended (an exception is recorded as ``run_failed``).

    A flat script (no ``with`` block) calls :meth:`close` at its end; an exception that
    escapes the script before then is still recorded as ``run_failed``: the Monitor chains
    itself into ``sys.excepthook`` until it is closed (``monitor.close(exc)`` in your own
    ``except`` does the same explicitly). Create it after
    ``torch.distributed.init_process_group()`` when there are several ranks.
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
        self.config = config = TrainConfig.given(run_dir, config, options, who="Monitor")
        self.session = Session(config, scheduler=scheduler)
        self.session.start(max_steps=max_steps, install_signals=install_signals)
        self._resume: ResumeChoice | None = None
        self._resume_recorded = False
        self._stopped = False  # stop() was called; a decided stop is the session's
        self._saver: AsyncSaver | None = None
        self._declared: set[Path] = set()
        self._announced: set[str] = set()  # paths record_started() announced, awaiting record()
        self._signal_stops_before = len(SIGNAL_STOPS)
        self._entered = False  # used as a with block: it can end a preempted submitit attempt
        self._first_step = True
        self._loaded: str | None = None  # what load() returned, until the first step after it
        self._excepthook = ExceptHook(self._uncaught).install()
        self.loggers = LoggerRuns(self.session, lambda: self.resume_step)
        """The same TensorBoard / W&B / MLflow run in every attempt (docs/loggers.md)."""

    # --- resume ------------------------------------------------------------------------------

    @property
    def resume_choice(self) -> ResumeChoice:
        """The resume rule's answer for this attempt (computed once, agreed by all ranks)."""
        if self._resume is None:
            self._resume = self.session.choose_resume()
        return self._resume

    def resume_path(self) -> str | None:
        """The checkpoint to resume from, validated, and recorded as this attempt's resume;
        None on a fresh start.

        For a loader that restores in place and hands nothing back to ckptdash
        (``fabric.load(path, state)``, ``dcp.load``, your own ``load_state_dict``): the
        path is the resume rule's choice (the pin, else the newest valid checkpoint),
        checked file by file, and ``run_resumed`` names it, so ``ckptdash status``
        shows "resumed from". Call it on every rank (the choice is agreed), then load;
        the resume is recorded once however often it is called. Unlike
        :func:`ckptdash.resume_path`, which only answers, this records.

        >>> if (path := monitor.resume_path()) is not None:  # doctest: +SKIP
        ...     fabric.load(path, state)
        """
        choice = self.resume_choice
        if choice.path is not None and not self._resume_recorded:
            self._resume_recorded = True
            self.session.record_resumed(choice.path, choice.reason, step=choice.step)
        return choice.path

    @property
    def resume_step(self) -> int | None:
        """The step of the checkpoint this attempt resumes from (None: a fresh start)."""
        choice = self.resume_choice
        return choice.step if choice.path is not None else None

    def load(self, map_location: Any = "cpu", weights_only: bool = True) -> Any:
        """Load the checkpoint the resume rule chose and record it; None on a fresh start.

        A file is loaded with ``torch.load``. ``weights_only=True`` (the default) lets it
        rebuild only tensors, numbers, strings and containers: a checkpoint file someone
        swapped for a malicious pickle cannot run code. Pass ``weights_only=False`` only for
        files you trust that hold other objects (it unpickles arbitrary classes).
        A directory checkpoint (saved through
        :meth:`saving` or recorded with :meth:`record`) is returned as its
        :class:`~pathlib.Path`, already validated file by file, for the framework's own
        loader: ``dcp.load(state, checkpoint_id=monitor.load())``.
        """
        import torch

        choice = self.resume_choice
        if choice.path is None:
            return None
        if os.path.isdir(choice.path):
            # A directory checkpoint (DCP, Hugging Face, Accelerate) is loaded by its own
            # framework: hand back its path, e.g. for dcp.load(state, checkpoint_id=path).
            self.resume_path()
            self._loaded = choice.path
            return Path(choice.path)
        self._loaded = choice.path
        obj = torch.load(choice.path, map_location=map_location, weights_only=weights_only)
        self.resume_path()
        return obj

    # --- the loop ----------------------------------------------------------------------------

    def step(self, step: int, *, epoch: int | None = None, **metrics: Any) -> Decision | None:
        """Call once per optimizer step, after it. Cheap unless a check is due."""
        if self._first_step:
            self._first_step = False
            if not self._entered:  # only a with block can end a preempted submitit attempt
                lead = self.session.rank == 0
                submitit_job.warn_if_unwrapped("ckptdash.Monitor outside a with block", lead=lead)
        self._loaded = None
        decision = self.session.boundary(step, epoch, metrics)
        if decision is not None and not decision.save:  # an anomaly: stop, nothing to save
            self.session.after_save(None)
        return decision

    @property
    def should_save(self) -> bool:
        """A save was decided (signal or command): call :meth:`save` before the next step."""
        return self.session.decision is not None

    @property
    def should_stop(self) -> bool:
        """Training should end now (after a signal save, or a Stop after save command)."""
        return self._stopped or self.session.stop_reason is not None

    @property
    def preempted(self) -> bool:
        """A signal stopped this attempt (saved, and requeued where the policy allowed): the
        training did not finish, so code after the loop should not act as if it had."""
        return self.session.stop_reason in ("preempted", "terminated")

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
        resumable: bool | None = None,
    ) -> CheckpointSaved | None:
        """Save ``state`` atomically with ``torch.save`` and record it.

        ``trigger`` defaults to the pending decision's (``signal``/``manual``) or
        ``api``. ``path`` defaults to ``checkpoints/step=N.ckpt`` in the run
        directory. A dict ``state`` gets a ``ckptdash`` key with trigger,
        attempt, scheduler and job id. Only rank 0 writes unless ``all_ranks``.
        ``resumable=False``: an artifact, never resumed from
        (:mod:`ckptdash.train.checkpoints.artifacts`).
        """
        if self._saver is not None:
            self._saver.wait()  # after the background saves: a path's newest save wins
        session = self.session
        artifact = artifact_of(state, resumable)
        decision = session.decision if artifact is None else None  # an artifact answers none
        trig: Trigger = trigger or (decision.trigger if decision else "api")
        target = Path(path) if path else self.config.checkpoint_path / f"step={session.step}.ckpt"
        if isinstance(state, dict):
            state = {**state, META_KEY: session.metadata(trig)}
        saved = None
        if session.rank == 0 or all_ranks:
            self.declare_checkpoint_dir(os.path.dirname(os.path.abspath(target)))
            try:
                saved = save_atomic(
                    session.writer if session.rank == 0 else None,
                    state,
                    os.path.abspath(target),
                    trigger=trig,
                    step=session.step,
                    epoch=session.epoch,
                    artifact=artifact,
                )
            except BaseException as exc:
                if decision is not None:
                    session.save_failed(exc)
                raise
        if decision is not None and (trigger is None or trigger == decision.trigger):
            session.after_save(saved, str(target))
        return saved

    def save_async(
        self,
        state: Any,
        path: str | os.PathLike[str] | None = None,
        *,
        trigger: Trigger | None = None,
        all_ranks: bool = False,
        resumable: bool | None = None,
    ) -> SaveHandle:
        """Like :meth:`save`, but training stalls only while ``state`` is copied to memory.

        Every tensor of ``state`` is copied into reused CPU buffers (pinned for CUDA
        tensors) before this returns, so the loop may change its tensors right away; a
        background thread then writes the copy as :meth:`save` would and records
        ``checkpoint_saved`` with the stall as ``blocking_s``. At most
        ``TrainConfig.async_in_flight`` (1) saves are in flight: the next one waits.

        A save ckptdash asked for (:attr:`should_save`: a signal, Save now, Stop after save)
        is written right here, after the saves in flight, as :meth:`save` writes it:
        commands are answered, the job requeued or stopped only once it is durable.
        Leaving the ``with`` block (or :meth:`close`) waits for every save in flight.
        The returned handle's ``result()`` raises if the save failed.

        >>> handle = monitor.save_async({"model": model.state_dict()})  # doctest: +SKIP
        """
        session = self.session
        artifact = artifact_of(state, resumable)
        decision = session.decision if artifact is None else None  # an artifact answers none
        trig: Trigger = trigger or (decision.trigger if decision else "api")
        target = Path(path) if path else self.config.checkpoint_path / f"step={session.step}.ckpt"
        if decision is not None and (trigger is None or trigger == decision.trigger):
            # It must be durable before commands are answered, the job requeued or stopped:
            # training waits for all of it either way, and writing directly is faster than
            # staging a copy first (and its stall is recorded as the whole save).
            saved = self.save(state, target, trigger=trigger, all_ranks=all_ranks)
            return SaveHandle.finished(os.path.abspath(target), trig, session.step, saved)
        if isinstance(state, dict):
            state = {**state, META_KEY: session.metadata(trig)}
        if self._saver is None:
            self._saver = AsyncSaver(
                max_in_flight=self.config.async_in_flight, direct_io=self.config.direct_io
            )
        if session.rank != 0 and not all_ranks:
            return SaveHandle.finished(os.path.abspath(target), trig, session.step)
        return self._saver.submit(
            session.writer if session.rank == 0 else None,
            state,
            target,
            trigger=trig,
            step=session.step,
            epoch=session.epoch,
            artifact=artifact,
        )

    def wait_saves(self, timeout: float | None = None) -> None:
        """Wait until every :meth:`save_async` so far is durable (or failed: see its handle)."""
        if self._saver is not None:
            self._saver.wait(timeout)

    # --- saves written by other code ---------------------------------------------------------

    @contextlib.contextmanager
    def saving(
        self, path: str | os.PathLike[str] | None = None, *, trigger: Trigger | None = None
    ) -> Iterator[Path]:
        """Save with any writer: yields a path next to ``path`` for it to write a file or a
        directory, then publishes it atomically onto ``path`` and records it.

        On leaving the block every file is fsync'ed, a directory gets a manifest of its
        files (:mod:`ckptdash.rundir.manifest`), and the result is renamed onto ``path``. An
        exception inside publishes nothing and records ``checkpoint_failed``. Every rank
        must enter the block (it agrees on one temp name, and the lead rank publishes
        only once every rank's writing returned), so ranks may write shards into it::

            with monitor.saving(f"{run_dir}/checkpoints/step={step}") as tmp:
                dcp.save(model.state_dict(), checkpoint_id=tmp)

        ``trigger`` and ``path`` default as in :meth:`save` (``path`` without the
        ``.ckpt``). A pending signal, Save now or Stop decision is answered by this save.
        The folder holding ``path`` is declared as one of the run's checkpoint folders.
        """
        session = self.session
        trig = self._trigger(trigger)
        target = Path(path) if path else self.config.checkpoint_path / f"step={session.step}"
        self.declare_checkpoint_dir(Path(os.path.abspath(target)).parent)
        pending = publish.begin(session, target, trig)
        error: BaseException | None = None
        try:
            yield pending.temp
        except BaseException as exc:
            error = exc
        try:
            saved = publish.finish(session, pending, error)
        except BaseException as exc:
            self._settle(trigger, None, str(pending.target), exc)
            raise
        self._settle(trigger, saved, str(pending.target), None)

    def record(
        self,
        path: str | os.PathLike[str],
        *,
        trigger: Trigger | None = None,
        step: int | None = None,
        resumable: bool | str = True,
    ) -> CheckpointSaved | None:
        """Record a file or directory checkpoint that other code already wrote in place.

        Call it on every rank once the writing returned (a collective with several
        ranks: the lead rank reads only after all of them got here). The lead fsyncs
        every file and, for a directory, writes its manifest; then ``checkpoint_saved``.
        The folder holding ``path`` is declared as one of the run's checkpoint folders.
        ``step`` defaults to the last one given to :meth:`step`. A pending decision is
        answered as by :meth:`save`. ``resumable``: False (or why not) for an artifact.
        """
        session = self.session
        if step is not None:
            session.step = step
        trig = self._trigger(trigger)
        target = os.path.abspath(path)
        self.declare_checkpoint_dir(os.path.dirname(target))
        dist.agree_max([0])  # a barrier: every rank's files are written
        saved = None
        error: str | None = None
        artifact = resumable if isinstance(resumable, str) else artifact_of(None, resumable)
        if session.rank == 0:
            try:
                saved = record_save(
                    session.writer,
                    target,
                    trigger=trig,
                    step=session.step,
                    epoch=session.epoch,
                    write=lambda: durable_existing(target),
                    announce=target not in self._announced,
                    artifact=artifact,
                )
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        self._announced.discard(target)
        error = dist.broadcast_object(error)
        if error is not None:
            failure = SaveError(f"{target}: could not be recorded ({error})")
            self._settle(trigger, None, target, failure)
            raise failure
        self._settle(trigger, saved, target, None)
        return saved

    def record_started(
        self, path: str | os.PathLike[str], *, trigger: Trigger | None = None
    ) -> None:
        """Record that other code is about to write a checkpoint in place at ``path``
        (rank 0 writes). If the process dies before :meth:`record`, the next attempt
        records the save as interrupted instead of it leaving no trace."""
        target = os.path.abspath(path)
        if self.session.rank == 0:
            self.declare_checkpoint_dir(os.path.dirname(target))
            self.session.writer.emit(
                CheckpointStarted,
                step=self.session.step,
                path=target,
                trigger=self._trigger(trigger),
            )
            self._announced.add(target)

    def record_removed(self, path: str | os.PathLike[str], reason: str = "removed") -> None:
        """Record that a checkpoint was deleted (e.g. a framework's rotation); rank 0 writes."""
        if self.session.rank == 0:
            self.session.writer.emit(
                CheckpointRemoved, step=self.session.step, path=os.path.abspath(path), reason=reason
            )

    def _trigger(self, trigger: Trigger | None) -> Trigger:
        decision = self.session.decision
        return trigger or (decision.trigger if decision else "api")

    def _settle(
        self,
        trigger: Trigger | None,
        saved: CheckpointSaved | None,
        path: str,
        error: BaseException | None,
    ) -> None:
        """Answer the pending decision with this save's outcome, as :meth:`save` does."""
        decision = self.session.decision
        if decision is None or (trigger is not None and trigger != decision.trigger):
            return
        if error is not None:
            self.session.save_failed(error)
            return
        self.session.after_save(saved, path)

    def declare_checkpoint_dir(self, path: str | os.PathLike[str]) -> None:
        """Tell the run that checkpoints live in ``path`` too (a framework's output folder),
        so records there count; once per folder, on rank 0."""
        folder = Path(os.path.abspath(path))
        if folder not in self._declared and self.session.rank == 0:
            self._declared.add(folder)
            self.session.declare_checkpoint_dir(folder)

    def stop(self) -> None:
        """Ask the loop to end (sets :attr:`should_stop`)."""
        self._stopped = True

    def close(self, error: BaseException | None = None) -> None:
        """Wait for the saves in flight, record how the attempt ended, restore the handlers.

        Leaving a ``with`` block closes it too; in a submitit job (not wrapped in
        :func:`ckptdash.submitit.preemptible`) whose training a signal stopped, leaving
        the block then exits the process without a result (``SystemExit``): the
        function's early return would otherwise become ``job.result()``, and the
        requeued attempt returns the finished training's value.

        An error after :meth:`load` and before the first :meth:`step` (``load_state_dict``
        refusing the checkpoint) is recorded as one line naming the checkpoint and the fix
        (``ckptdash resume RUN --fresh``), and that line is added to the exception's notes.
        """
        self._excepthook.uninstall()
        self._finish_saves()
        failure = None
        at_load = error is not None and self._loaded is not None
        if at_load and isinstance(error, MISFIT_ERRORS) and not isinstance(error, CkptDashError):
            assert self._loaded is not None
            older = older_resumable(self.config.run_dir, self._loaded)
            failure = misfit_message(self.config.run_dir, self._loaded, error, older=older)
            add_note = getattr(error, "add_note", None)  # Python 3.11+
            if add_note is not None:
                add_note(f"ckptdash: {failure}")
        if error is not None and self.session.rank == 0:
            self.session.record_exception(error)
        self.session.close(error=error, failure=failure)

    def __enter__(self) -> Monitor:
        self._entered = True
        return self

    def _uncaught(self, error: BaseException) -> None:
        """An exception escaped a script that never closed the Monitor (the excepthook)."""
        if isinstance(error, KeyboardInterrupt):
            self._excepthook.uninstall()
            self._finish_saves()
            self.session.close(reason="interrupted")
        else:
            self.close(error)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, KeyboardInterrupt):
            self._finish_saves()
            self.session.close(reason="interrupted")
            return
        self.close(exc)
        stopped_by_signal = len(SIGNAL_STOPS) > self._signal_stops_before
        if exc is None and stopped_by_signal and submitit_job.unwrapped():
            raise SystemExit(submitit_job.STOPPED_EXIT_CODE)  # see close(): no partial result

    def _finish_saves(self) -> None:
        # Before the attempt's end is recorded: a save still being written when the
        # process exits would be lost, and the next attempt would resume from an older one.
        if self._saver is not None:
            self._saver.wait()
            for failed in self._saver.take_failures():
                warnings.warn(
                    f"ckptdash: the background save of {failed.path} failed: {failed.error}",
                    RuntimeWarning,
                    stacklevel=3,
                )
