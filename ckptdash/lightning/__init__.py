"""ckptdash for PyTorch Lightning: add one callback to the Trainer.

    trainer = L.Trainer(callbacks=[CkptDashCallback("runs/exp1")])
    trainer.fit(model)            # no ckpt_path: the resume rule picks it

The callback wraps the Trainer's CheckpointIO (whatever it is: the default,
a custom one, ``AsyncCheckpointIO``), so every write — ModelCheckpoint
(``periodic``), ``trainer.save_checkpoint`` (``api``), OnExceptionCheckpoint
(``exception``), and its own signal/manual saves — is recorded with its path,
size, duration, checksum and trigger. Works with ``lightning.pytorch`` or, if
that is missing, ``pytorch_lightning``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, Final

from ckptdash.errors import WrongFrameworkError
from ckptdash.events import CheckpointSaved, Trigger
from ckptdash.lightning import compat
from ckptdash.lightning.checkpoint_io import (
    RecordingCheckpointIO,
    TaggingCheckpointIO,
    flush_async,
    record_written,
)
from ckptdash.lightning.compat import (
    AsyncCheckpointIO,
    OnExceptionCheckpoint,
    end_reason,
    in_spawn_launcher,
    pl,
    under_lightning_interrupt_handling,
)
from ckptdash.lightning.fit_start import install_fit_start_hook
from ckptdash.lightning.links import claim_lasts, follow_links, make_lasts
from ckptdash.lightning.loggers import TrainerLoggers, install_fit_hook
from ckptdash.lightning.resume import hook_resume
from ckptdash.lightning.signals import take_signals_over
from ckptdash.lightning.strategies import record_outside_io, replaces_save, writes_shards
from ckptdash.rundir import RunDir
from ckptdash.schedulers.base import Scheduler
from ckptdash.train.checkpoints.async_save import AsyncSaver
from ckptdash.train.config import TrainConfig
from ckptdash.train.ending import submitit_job
from ckptdash.train.ending.forward import forward_to_children
from ckptdash.train.engine.decision import Decision
from ckptdash.train.engine.session import Session
from ckptdash.train.engine.ticker import Ticker

# Configured intervals shorter than this check at every step anyway; the ticker need not spin.
_SHORTEST_CHECK_PERIOD_S: Final = 0.001


# Lightning dispatches every per-batch hook to every callback through a profiler context,
# ~2.5 µs each even for the base class's empty method; a hook attribute that is not
# callable is skipped outright (compat.skip_hook). These are the per-batch hooks ckptdash
# does not use.
_UNUSED_BATCH_HOOKS: Final = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_validation_batch_start",
    "on_validation_batch_end",
)


def _skip_unused_hooks(callback: pl.Callback) -> None:
    """Let Lightning skip the per-batch hooks that nobody overrode (a subclass may)."""
    for name in _UNUSED_BATCH_HOOKS:
        if getattr(type(callback), name, None) is getattr(pl.Callback, name, None):
            compat.skip_hook(callback, name)


_NOT_FOR_FABRIC: Final = (
    "ckptdash: CkptDashCallback is the Lightning Trainer's callback, and Fabric never runs its"
    " hooks (no run directory, no signal handling: a signal would end the job unsaved). With"
    " Fabric, drop it from L.Fabric(callbacks=[...]) and wrap the loop in"
    " ckptdash.fabric.FabricMonitor(fabric, run_dir) after fabric.launch()"
    " (docs/frameworks.md, Lightning Fabric)."
)


def _before_fit(trainer: Any) -> None:
    """A fit starts (before Lightning opens any logger): the first CkptDashCallback names the
    Trainer's loggers after its run (docs/loggers.md)."""
    for cb in getattr(trainer, "callbacks", []):
        if isinstance(cb, CkptDashCallback):
            if cb.config.continue_loggers:
                cb._loggers = TrainerLoggers(trainer, RunDir(cb.config.run_dir))
                cb._loggers.configure()
            return


def _ckptdash_callback(trainer: Any) -> CkptDashCallback | None:
    """The trainer's first CkptDashCallback, clear of any earlier fit's setup; or None."""
    for cb in getattr(trainer, "callbacks", []):
        if isinstance(cb, CkptDashCallback):
            cb._set_up = False
            return cb
    return None


def _failed_at_start(callback: CkptDashCallback, trainer: Any, error: BaseException) -> None:
    """A fit() that raised before ``callback``'s setup (Lightning refused its ``ckpt_path``,
    a misconfigured Trainer): record the attempt, failed with that error. Never raises."""
    if callback._set_up or callback.session is not None:
        return  # the attempt is the callback's: it records its own end
    with contextlib.suppress(Exception):  # another live job's directory, say: its refusal
        session = Session(callback.config, scheduler=callback._scheduler)
        max_steps = getattr(trainer, "max_steps", None)
        session.start(
            max_steps=max_steps if max_steps and max_steps > 0 else None, install_signals=False
        )
        session.record_exception(error)
        session.close(error=error)


class CkptDashCallback(pl.Callback):
    """Records checkpoints and signals of a Lightning run, handles preemption and requeue.

    ``run_dir`` and any :class:`~ckptdash.train.config.TrainConfig` field may be
    given as keywords. ``on_checkpoint_saved`` is called with each durable
    :class:`~ckptdash.events.CheckpointSaved` (or override the method).
    Rank 0 writes the run's events; every rank takes part in the decisions.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        config: TrainConfig | None = None,
        scheduler: Scheduler | None = None,
        on_checkpoint_saved: Callable[[CheckpointSaved], None] | None = None,
        **options: Any,
    ) -> None:
        self.config = TrainConfig.given(run_dir, config, options, who="CkptDashCallback")
        self._scheduler = scheduler
        self._user_hook = on_checkpoint_saved
        self.session: Session | None = None
        self._forced_trigger: Trigger | None = None
        self._error: BaseException | None = None
        self._ticker: Ticker | None = None
        self._loggers: TrainerLoggers | None = None
        self._stop_save: tuple[list[tuple[Any, str]], str, Trigger] | None = None
        """ckptdash's save that ends training: the last.ckpt files to make, path, trigger."""
        self._set_up = False
        """Whether this callback's setup ran for the fit now going on (see _failed_at_start)."""
        _skip_unused_hooks(self)
        if self.config.continue_loggers:
            install_fit_hook(_before_fit)
        install_fit_start_hook(_ckptdash_callback, _failed_at_start)

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the Trainer, callbacks included, for its workers: the one moment a
        # callback runs in the launcher. A signal to the launcher (SLURM's --signal=B: with
        # `exec python`) would kill it and its workers; from now on it reaches the workers.
        if self.session is None and in_spawn_launcher():
            forward_to_children(list(self.config.signals))
        return self.__dict__.copy()

    # --- triggers ------------------------------------------------------------------------------

    def trigger_now(self) -> Trigger:
        """Why the save happening now happens: ours, ModelCheckpoint, OnException, or the user."""
        if self._forced_trigger is not None:
            return self._forced_trigger
        owner = compat.saving_callback()
        if owner is None:
            return "api"
        return "exception" if isinstance(owner, OnExceptionCheckpoint) else "periodic"

    @contextlib.contextmanager
    def _saving(self, trigger: Trigger) -> Iterator[None]:
        self._forced_trigger = trigger
        try:
            yield
        finally:
            self._forced_trigger = None

    def on_checkpoint_saved(self, event: CheckpointSaved) -> None:
        """Called once a checkpoint is durable (with async IO: when the write finished)."""
        if self._user_hook is not None:
            self._user_hook(event)

    # --- Lightning Fabric: not this callback's framework ---------------------------------------

    # Fabric calls these two on its callbacks (at fabric.setup and after optimizer.step); the
    # Trainer never does. Failing there is the earliest moment Fabric shows itself.
    def on_after_setup(self, fabric: Any = None, module: Any = None) -> None:
        raise WrongFrameworkError(_NOT_FOR_FABRIC)

    def on_after_optimizer_step(self, strategy: Any = None, optimizer: Any = None) -> None:
        raise WrongFrameworkError(_NOT_FOR_FABRIC)

    # --- Lightning hooks ---------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.session is not None:
            return
        self._set_up = True
        session = Session(self.config, scheduler=self._scheduler)
        self.session = session
        max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        session.start(max_steps=max_steps, install_signals=False)
        # Before Lightning's fit() captures the handlers it restores at its teardown (which
        # runs before ours, after run_finished may be near): a late USR2 is then held by
        # what it restores, not ended by its default action (train/ending/signals.py).
        session.signals.hold_late()
        # fit() returns after a preemption and the submitted function goes on: only a wrapper
        # can keep its early return from becoming the submitit job's result.
        submitit_job.warn_if_unwrapped(
            "ckptdash.lightning.CkptDashCallback", lead=session.rank == 0
        )
        self._wrap_checkpoint_io(trainer, session)
        self._record_sharded_saves(trainer, session)
        follow_links(trainer, session)
        if self.config.resume:
            hook_resume(trainer, session)
        self._close_on_failure(trainer)  # after: a refused ckpt_path fails the attempt too

    def _wrap_checkpoint_io(self, trainer: Any, session: Session) -> None:
        io = trainer.strategy.checkpoint_io
        if isinstance(io, RecordingCheckpointIO):
            return
        if isinstance(io, AsyncCheckpointIO):
            # Record inside the worker thread, so "saved" means written, not queued.
            compat.set_async_inner(io, RecordingCheckpointIO(io.checkpoint_io, session, self))
            trainer.strategy.checkpoint_io = TaggingCheckpointIO(io, session, self)
        else:
            saver = None
            if self.config.async_save:
                saver = AsyncSaver(
                    max_in_flight=self.config.async_in_flight, direct_io=self.config.direct_io
                )
            trainer.strategy.checkpoint_io = RecordingCheckpointIO(io, session, self, saver)

    def _record_sharded_saves(self, trainer: Any, session: Session) -> None:
        # DeepSpeed, FSDP (sharded) and ModelParallel (distributed checkpoint) write a
        # directory of shards themselves, on every rank, without the CheckpointIO; any other
        # strategy with its own save_checkpoint is watched (ckptdash.lightning.strategies).
        strategy = trainer.strategy
        original = strategy.save_checkpoint
        if compat.is_wrapped(original):
            return
        if writes_shards(strategy):

            def save_checkpoint(
                checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
            ) -> None:
                # The strategy returns on rank 0 after every rank's shards are written (the
                # distributed save ends in a gather): rank 0 fsyncs them all and records it.
                record_written(
                    session,
                    self,
                    checkpoint,
                    filepath,
                    lambda: original(checkpoint, filepath, storage_options),
                    lead=session.rank == 0,
                )

        elif replaces_save(strategy):

            def save_checkpoint(
                checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
            ) -> None:
                record_outside_io(
                    session,
                    self,
                    strategy,
                    checkpoint,
                    filepath,
                    lambda: original(checkpoint, filepath, storage_options),
                )

        else:
            return
        strategy.save_checkpoint = compat.mark_wrapped(save_checkpoint)

    def _close_on_failure(self, trainer: Any) -> None:
        """Make sure a fit() that raises records ``run_failed``, whatever Lightning then runs.

        Lightning's interrupt path calls the callbacks' ``on_exception`` (ours first, then
        checkpoint callbacks such as OnExceptionCheckpoint, which save there), then the
        strategy's ``on_exception`` — and never the callbacks' ``teardown``. So the attempt
        is closed in the strategy's hook, after every exception save. A ddp_spawn worker runs
        fit() outside that path (no hook at all): there the stage itself is wrapped.
        """
        strategy = trainer.strategy
        original = strategy.on_exception
        if not compat.is_wrapped(original):

            def on_exception(exception: BaseException) -> None:
                self._fail(trainer, exception)
                original(exception)

            strategy.on_exception = compat.mark_wrapped(on_exception)
        if under_lightning_interrupt_handling():
            return
        compat.wrap_run_stage(trainer, lambda stage: self._failing_on_error(trainer, stage))
        connector = compat.checkpoint_connector(trainer)  # the resume choice can refuse
        connector.resume_start = self._failing_on_error(trainer, connector.resume_start)

    def _failing_on_error(self, trainer: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method``, ending the attempt as failed when it raises (for a bare ddp_spawn worker)."""

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except BaseException as exc:
                self._fail(trainer, exc)
                raise

        return guarded

    def _fail(self, trainer: Any, exception: BaseException) -> None:
        """Record the exception (once) and end the attempt as failed, on this rank."""
        self._stop_timed_checks()
        session, self.session = self.session, None
        if session is None:
            return
        with contextlib.suppress(Exception):  # a failed async save is already an event
            flush_async(trainer.strategy.checkpoint_io)
        if self._error is None:  # on_exception did not run (a ddp_spawn worker)
            session.record_exception(exception)
        error, self._error = self._error or exception, None
        if isinstance(error, KeyboardInterrupt):  # Ctrl+C: stopped on purpose, as in Monitor
            session.close(reason="interrupted")
        else:
            session.close(error=error)

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        # The sanity-check validation runs with Lightning's handlers already registered.
        if self.session is not None:
            take_signals_over(trainer, self.session)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        session = self.session
        if session is None:
            return
        # ModelCheckpoint has resolved its folder by now (in its own setup).
        for cb in getattr(trainer, "checkpoint_callbacks", []):
            dirpath = getattr(cb, "dirpath", None)
            if dirpath:
                session.declare_checkpoint_dir(dirpath)
        take_signals_over(trainer, session)
        if self._loggers is not None:  # the checkpoint is loaded: global_step is the resume step
            loggers, self._loggers = self._loggers, None
            loggers.attach(session, trainer.global_step)
        overridden = type(self).on_train_batch_end is not CkptDashCallback.on_train_batch_end
        if session.world_size == 1 and not overridden:
            # One process: check when a period has passed or a signal came, not at every step.
            # The per-step hook is off (Lightning skips it) until the ticker or the signal
            # handler switches it on for the next step boundary. Ranks of a larger world
            # count steps instead, so that they all check at the same step.
            session.signals.on_receive = self._check_at_next_step
            period = max(session.check_period_s, _SHORTEST_CHECK_PERIOD_S)
            self._ticker = Ticker(period, self._check_at_next_step, name="ckptdash-check").start()
            self._check_at_next_step()  # the first step: heartbeat, commands left waiting

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._at_step_end(trainer, timed=False)

    def _check_at_next_step(self) -> None:
        # An attribute assignment: safe from the ticker's thread and inside a signal handler.
        self.on_train_batch_end = self._timed_check  # type: ignore[method-assign]

    def _timed_check(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.on_train_batch_end = None  # type: ignore[assignment]  # until asked again
        self._at_step_end(trainer, timed=True)

    def _at_step_end(self, trainer: Any, *, timed: bool) -> None:
        session = self.session
        if session is None:
            return
        look = session.check_now if timed else session.boundary
        decision = look(
            trainer.global_step, trainer.current_epoch, lambda: trainer.callback_metrics
        )
        self._act(trainer, session, decision)

    def _stop_timed_checks(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None
        if self.session is not None:
            self.session.signals.on_receive = None
        self.__dict__.pop("on_train_batch_end", None)  # back to the class's per-step hook

    def _act(self, trainer: Any, session: Session, decision: Decision | None) -> None:
        """Carry out a decision at this step boundary: save, then answer, requeue or stop."""
        if decision is None:
            return
        if not decision.save:  # an anomaly: stop (and requeue) without saving the diverged model
            session.after_save(None)
            trainer.should_stop = trainer.should_stop or session.stop_reason is not None
            return
        path = self.config.checkpoint_path / f"step={trainer.global_step}-{decision.trigger}.ckpt"
        lasts = claim_lasts(trainer) if decision.stop else []
        with self._saving(decision.trigger):
            try:
                trainer.save_checkpoint(path)
                # With AsyncCheckpointIO the save is only queued: wait until it is written
                # before answering commands or requeueing (SLURM kills the job right after).
                flush_async(trainer.strategy.checkpoint_io)
            except Exception as exc:
                session.save_failed(exc)
                raise
        session.after_save(None, str(path))
        if session.stop_reason is not None:
            trainer.should_stop = True
            self._stop_save = (lasts, os.path.abspath(path), decision.trigger)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop_timed_checks()
        io = trainer.strategy.checkpoint_io
        if isinstance(io, RecordingCheckpointIO) and io.saver is not None:
            io.saver.wait()  # Lightning skips callbacks' teardown after an exception
        session = self.session
        if session is None or self._error is not None:
            return
        self._error = exception
        session.step = trainer.global_step
        # Every rank that got it records it (ranks other than 0 in their own file); the
        # attempt is closed as failed once exception saves ran (see _close_on_failure).
        session.record_exception(exception)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop_timed_checks()
        session = self.session
        if session is None:
            return
        session.step = trainer.global_step
        session.heartbeat(trainer.callback_metrics)
        if session.stop_reason is not None:
            # ckptdash ended training (a signal or a command). After a requeue SLURM's SIGTERM
            # follows within milliseconds, and Lightning's teardown restores the default
            # SIGTERM action before callbacks' teardown runs: record the end now.
            with contextlib.suppress(Exception):  # a failed async save is already an event
                flush_async(trainer.strategy.checkpoint_io)
            if self._stop_save is not None:
                stop_save, self._stop_save = self._stop_save, None
                with contextlib.suppress(OSError):  # Lightning would have tried; no worse
                    make_lasts(trainer, session, *stop_save)
            session.close()
        else:
            session.release_signals()  # one that came after the last check is recorded too

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.session is None:
            return
        self._stop_timed_checks()
        io = trainer.strategy.checkpoint_io
        if isinstance(io, TaggingCheckpointIO):
            # Let queued async saves finish so their events are written before we close.
            with contextlib.suppress(Exception):
                io.inner.teardown()
        if isinstance(io, RecordingCheckpointIO) and io.saver is not None:
            io.saver.wait()  # a failed one is already a checkpoint_failed event
        session, self.session = self.session, None
        session.close(end_reason(trainer), error=self._error)
        self._error = None
