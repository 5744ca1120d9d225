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
import inspect
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from ckptdash.events import CheckpointRemoved, CheckpointSaved, Trigger
from ckptdash.train.async_save import AsyncSaver
from ckptdash.train.config import TrainConfig
from ckptdash.train.decision import Decision
from ckptdash.train.forward import forward_to_children
from ckptdash.train.saving import META_KEY, durable_existing, record_save, save_atomic
from ckptdash.train.scheduler import Scheduler
from ckptdash.train.session import Session
from ckptdash.train.signals import signal_name
from ckptdash.train.ticker import Ticker

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
except ImportError:  # pragma: no cover - exercised only where the old package name is installed
    # The old package name ships the same classes; mypy sees them as distinct types.
    import pytorch_lightning as pl  # type: ignore[no-redef,unused-ignore]
    from pytorch_lightning.callbacks import (  # type: ignore[assignment,unused-ignore]
        EarlyStopping,
        ModelCheckpoint,
        OnExceptionCheckpoint,
    )
    from pytorch_lightning.plugins.io import (  # type: ignore[assignment,unused-ignore]
        AsyncCheckpointIO,
        CheckpointIO,
        TorchCheckpointIO,
    )

_HPC_NAME = re.compile(r"^hpc_ckpt_\d+\.ckpt$")
# The file name _MultiProcessingLauncher gives the weights a ddp_spawn worker hands back.
_SPAWN_HANDOVER_NAME: Final = ".temp.ckpt"
# Configured intervals shorter than this check at every step anyway; the ticker need not spin.
_SHORTEST_CHECK_PERIOD_S: Final = 0.001


class RecordingCheckpointIO(CheckpointIO):
    """Wraps a CheckpointIO: records every save/remove; saves atomically where it can.

    For Lightning's default ``TorchCheckpointIO`` ckptdash writes the same
    ``torch.save`` file itself, atomically and with the checksum computed while
    writing. Any other IO writes as it always did; ckptdash then fsyncs the
    result and reads it once for the checksum.
    """

    def __init__(
        self,
        inner: Any,
        session: Session,
        callback: CkptDashCallback,
        saver: AsyncSaver | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.session = session
        self.callback = callback
        self.saver = saver
        """ckptdash's own background saves (``async_save=True``): stage here, persist later."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if _is_spawn_handover(path):
            # ddp_spawn hands the final weights to its launcher through a temp file that the
            # launcher deletes at once: not a checkpoint anyone can resume from.
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        _declare_dir_of(self.session, path)
        if type(self.inner) is not TorchCheckpointIO or storage_options is not None:
            _record_written(
                self.session,
                self.callback,
                checkpoint,
                path,
                lambda: self.inner.save_checkpoint(
                    checkpoint, path, storage_options=storage_options
                ),
            )
            return
        meta = _stamp(self.session, self.callback, checkpoint)
        trigger: Trigger = meta["trigger"]
        if self.saver is not None and self.callback._forced_trigger is not None:
            # A save ckptdash decided is waited for before it answers or requeues: written
            # directly (after the saves in flight), it is durable sooner than staged first.
            # An earlier background failure must not stop it (a preemption is coming).
            self.saver.wait()
        elif self.saver is not None:
            _raise_failed(self.saver)  # like AsyncCheckpointIO: a failed save ends fit()
            self.saver.submit(
                self.session.writer,
                checkpoint,
                os.fspath(path),
                trigger=trigger,
                step=meta.get("step"),
                epoch=checkpoint.get("epoch"),
                on_saved=self.callback.on_checkpoint_saved,
            )
            return
        saved = save_atomic(
            self.session.writer,
            checkpoint,
            os.path.abspath(os.fspath(path)),
            trigger=trigger,
            step=meta.get("step"),
            epoch=checkpoint.get("epoch"),
        )
        if saved is not None:
            self.callback.on_checkpoint_saved(saved)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.inner.load_checkpoint(path, *args, **kwargs)
        return out

    def remove_checkpoint(self, path: Any) -> None:
        if self.saver is not None:
            self.saver.wait()  # never remove a file a background save is still writing
        self.inner.remove_checkpoint(path)
        self.session.writer.emit(
            CheckpointRemoved, path=os.path.abspath(os.fspath(path)), reason="removed by Lightning"
        )

    def teardown(self) -> None:
        self.inner.teardown()


def _record_written(
    session: Session,
    callback: CkptDashCallback,
    checkpoint: dict[str, Any],
    path: Any,
    write_files: Callable[[], object],
    *,
    lead: bool = True,
) -> None:
    """Record a save that other code writes (a custom CheckpointIO, a sharded strategy): stamp
    ckptdash's metadata into ``checkpoint``, run ``write_files``, then on the ``lead`` rank fsync
    what it wrote (a file, or a directory of shards) and record it as saved."""
    meta = _stamp(session, callback, checkpoint)
    target = os.path.abspath(os.fspath(path))
    _declare_dir_of(session, target)

    def write() -> tuple[int, str]:
        write_files()
        return durable_existing(target) if lead else (0, "")

    saved = record_save(
        session.writer if lead else None,
        target,
        trigger=meta["trigger"],
        step=meta.get("step"),
        epoch=checkpoint.get("epoch"),
        write=write,
    )
    if saved is not None:
        callback.on_checkpoint_saved(saved)


def _declare_dir_of(session: Session, path: Any) -> None:
    """Declare the folder a checkpoint is saved in, so its record counts as this run's."""
    session.declare_checkpoint_dir(os.path.dirname(os.path.abspath(os.fspath(path))))


_UNKNOWN: Final = object()


def _given_ckpt_path(trainer: Any) -> Any:
    """The ``ckpt_path`` the user passed to ``trainer.fit`` (before Lightning resolved
    "last", "hpc" or its own defaults), or ``_UNKNOWN``. Lightning keeps no copy of it: it is
    read from the caller's frame, or, in a ddp_spawn worker, from the launched call."""
    frame = inspect.currentframe()
    while frame is not None:
        code, local = frame.f_code.co_name, frame.f_locals
        if code == "fit" and local.get("self") is trainer and "ckpt_path" in local:
            return local["ckpt_path"]
        if code == "_wrapping_function":  # fit's arguments, as the launcher passed them on
            function, args = local.get("function"), local.get("args")
            if getattr(function, "__name__", "") == "_fit_impl" and isinstance(args, tuple):
                return args[4] if len(args) >= 5 else _UNKNOWN
        frame = frame.f_back
    return _UNKNOWN


def _end_reason(trainer: Any) -> str:
    """Why a fit() that ran to its end ended: ``completed``, or ``completed: early stopping
    (<EarlyStopping's message>)`` when an EarlyStopping callback stopped it."""
    for cb in trainer.callbacks:
        message = getattr(cb, "stopping_reason_message", None)  # Lightning >= 2.6
        if isinstance(cb, EarlyStopping) and (cb.stopped_epoch or message):
            return f"completed: early stopping ({message or f'monitor {cb.monitor!r}'})"
    return "completed"


def _lightning_requeue_signal(trainer: Any) -> str | None:
    """The signal of Lightning's SLURM auto-requeue when it is on (SLURM detected), else None."""
    connector = getattr(trainer, "_accelerator_connector", None)
    env = getattr(connector, "cluster_environment", None)
    if type(env).__name__ != "SLURMEnvironment" or not getattr(env, "auto_requeue", False):
        return None
    signum = getattr(env, "requeue_signal", None)
    return None if signum is None else signal_name(int(signum))


def _in_spawn_launcher() -> bool:
    """Whether this runs inside a multiprocessing launcher's ``launch`` (ddp_spawn)."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "launch" and type(owner).__name__ == "_MultiProcessingLauncher":
            return True
        frame = frame.f_back
    return False


def _under_lightning_interrupt_handling() -> bool:
    """Whether this fit() runs inside Lightning's ``_call_and_handle_interrupt`` (which calls
    ``on_exception`` on failure); a ddp_spawn worker runs it bare."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "_call_and_handle_interrupt":
            return True
        frame = frame.f_back
    return False


def _is_spawn_handover(path: Any) -> bool:
    """Whether ``path`` is the ``<tmp>/.temp.ckpt`` a ddp_spawn worker writes for its launcher."""
    return bool(os.path.basename(os.fspath(path)) == _SPAWN_HANDOVER_NAME)


def _stamp(session: Session, callback: CkptDashCallback, checkpoint: dict[str, Any]) -> Any:
    """ckptdash's metadata in ``checkpoint`` (kept if a wrapper stamped it first), at the step
    the checkpoint itself holds: between checks the session's own step may lag behind."""
    step = checkpoint.get("global_step")
    if isinstance(step, int):
        session.step = step
    return checkpoint.setdefault(META_KEY, session.metadata(callback.trigger_now()))


def _writes_shards(strategy: Any) -> bool:
    """Whether ``strategy`` saves a directory of shards itself instead of through its IO."""
    return (
        getattr(strategy, "_state_dict_type", None) == "sharded"  # FSDPStrategy
        or getattr(strategy, "_save_distributed_checkpoint", False) is True  # ModelParallel
        or type(strategy).__name__ == "DeepSpeedStrategy"
    )


def _raise_failed(saver: AsyncSaver) -> None:
    for failed in saver.take_failures():
        assert failed.error is not None
        raise failed.error


def _flush_async(io: Any) -> None:
    """Wait for the saves an AsyncCheckpointIO queued (re-raise a failed one), or ckptdash's
    own background saves (their failures are events; the next save raises them)."""
    if isinstance(io, RecordingCheckpointIO) and io.saver is not None:
        io.saver.wait()
    if not isinstance(io, _TaggingCheckpointIO):
        return
    inner = io.inner
    executor = getattr(inner, "_executor", None)
    if executor is not None:
        executor.submit(lambda: None).result()  # one worker, in order: queued saves are done
    error = getattr(inner, "_error", None)
    if error is not None:
        raise error


class _TaggingCheckpointIO(RecordingCheckpointIO):
    """Outside an AsyncCheckpointIO: stamps the trigger on the caller's thread, then queues."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        _stamp(self.session, self.callback, checkpoint)
        _declare_dir_of(self.session, path)  # here, not in the worker thread
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)  # the inner recorder reports it


# Lightning dispatches every per-batch hook to every callback through a profiler context,
# ~2.5 µs each even for the base class's empty method; a hook attribute that is not
# callable is skipped outright. These are the per-batch hooks ckptdash does not use.
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
            setattr(callback, name, None)


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
        if config is None:
            if run_dir is None:
                raise TypeError("CkptDashCallback needs a run_dir (or a TrainConfig as config=)")
            config = TrainConfig(run_dir=run_dir, **options)
        self.config = config
        self._scheduler = scheduler
        self._user_hook = on_checkpoint_saved
        self.session: Session | None = None
        self._forced_trigger: Trigger | None = None
        self._error: BaseException | None = None
        self._ticker: Ticker | None = None
        _skip_unused_hooks(self)

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the Trainer, callbacks included, for its workers: the one moment a
        # callback runs in the launcher. A signal to the launcher (SLURM's --signal=B: with
        # `exec python`) would kill it and its workers; from now on it reaches the workers.
        if self.session is None and _in_spawn_launcher():
            forward_to_children(list(self.config.signals))
        return self.__dict__.copy()

    # --- triggers ------------------------------------------------------------------------------

    def trigger_now(self) -> Trigger:
        """Why the save happening now happens: ours, ModelCheckpoint, OnException, or the user."""
        if self._forced_trigger is not None:
            return self._forced_trigger
        frame = inspect.currentframe()
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, OnExceptionCheckpoint):
                return "exception"
            if isinstance(owner, ModelCheckpoint):
                return "periodic"
            frame = frame.f_back
        return "api"

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

    # --- Lightning hooks ---------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.session is not None:
            return
        session = Session(self.config, scheduler=self._scheduler)
        self.session = session
        max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        session.start(max_steps=max_steps, install_signals=False)
        self._wrap_checkpoint_io(trainer, session)
        self._record_sharded_saves(trainer, session)
        if self.config.resume:
            self._hook_resume(trainer, session)
        self._close_on_failure(trainer)  # after: a refused ckpt_path fails the attempt too

    def _wrap_checkpoint_io(self, trainer: Any, session: Session) -> None:
        io = trainer.strategy.checkpoint_io
        if isinstance(io, RecordingCheckpointIO):
            return
        if isinstance(io, AsyncCheckpointIO):
            # Record inside the worker thread, so "saved" means written, not queued.
            io._checkpoint_io = RecordingCheckpointIO(io.checkpoint_io, session, self)
            trainer.strategy.checkpoint_io = _TaggingCheckpointIO(io, session, self)
        else:
            saver = None
            if self.config.async_save:
                saver = AsyncSaver(max_in_flight=self.config.async_in_flight)
            trainer.strategy.checkpoint_io = RecordingCheckpointIO(io, session, self, saver)

    def _record_sharded_saves(self, trainer: Any, session: Session) -> None:
        # FSDP (sharded), ModelParallel (distributed checkpoint) and DeepSpeed write a
        # directory of shards themselves, on every rank, without the CheckpointIO.
        strategy = trainer.strategy
        original = strategy.save_checkpoint
        if not _writes_shards(strategy) or getattr(original, "_ckptdash", False):
            return

        def save_checkpoint(
            checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
        ) -> None:
            # The strategy returns on rank 0 after every rank's shards are written (the
            # distributed save ends in a gather): rank 0 fsyncs them all and records the save.
            _record_written(
                session,
                self,
                checkpoint,
                filepath,
                lambda: original(checkpoint, filepath, storage_options),
                lead=session.rank == 0,
            )

        save_checkpoint._ckptdash = True  # type: ignore[attr-defined]
        strategy.save_checkpoint = save_checkpoint

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
        if not getattr(original, "_ckptdash", False):

            def on_exception(exception: BaseException) -> None:
                self._fail(trainer, exception)
                original(exception)

            on_exception._ckptdash = True  # type: ignore[attr-defined]
            strategy.on_exception = on_exception
        if _under_lightning_interrupt_handling():
            return
        trainer._run_stage = self._failing_on_error(trainer, trainer._run_stage)
        connector = trainer._checkpoint_connector  # the resume choice can refuse (invalid)
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
            _flush_async(trainer.strategy.checkpoint_io)
        if self._error is None:  # on_exception did not run (a ddp_spawn worker)
            session.record_exception(exception)
        error, self._error = self._error or exception, None
        if isinstance(error, KeyboardInterrupt):  # Ctrl+C: stopped on purpose, as in Monitor
            session.close(reason="interrupted")
        else:
            session.close(error=error)

    def _hook_resume(self, trainer: Any, session: Session) -> None:
        # Lightning picks the path inside fit() before any hook runs, then hands it to
        # resume_start(); this is the one place a callback can apply its own rule.
        connector = trainer._checkpoint_connector
        original = connector.resume_start

        def resume_start(checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> Any:
            path = checkpoint_path
            given = _given_ckpt_path(trainer)
            hpc = path is not None and _HPC_NAME.match(Path(os.fspath(path)).name) is not None
            if given is None or (given is _UNKNOWN and (path is None or hpc)):
                # No choice of the user's: ckptdash's rule, over Lightning's own picks (an
                # old hpc_ckpt_N on SLURM, "last" when OnExceptionCheckpoint is there).
                choice = session.choose_resume()
                lightning_pick = f" (instead of Lightning's {Path(path).name})" if path else ""
                path, reason = choice.path, choice.reason + lightning_pick
            elif path is not None:
                # The user's explicit choice is respected, once it validates.
                reason = session.check_given(os.fspath(path))
            # else: the user asked (e.g. "last") and Lightning found nothing: load nothing.
            result = original(path, *args, **kwargs)
            if path is not None:
                loaded = getattr(connector, "_loaded_checkpoint", None) or {}
                step = loaded.get("global_step")
                step = step if isinstance(step, int) else None
                session.record_resumed(os.fspath(path), reason, step=step)
            return result

        connector.resume_start = resume_start

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        # The sanity-check validation runs with Lightning's handlers already registered.
        if self.session is not None:
            self._take_signals_over(trainer, self.session)

    def _take_signals_over(self, trainer: Any, session: Session) -> None:
        if session.signals.installed:
            return  # since the sanity check
        # Installed after Lightning registered its own handlers, so ours run first and
        # Lightning's SIGTERM handler cannot end fit() before the signal save.
        requeue_signal = _lightning_requeue_signal(trainer)
        if requeue_signal is not None:
            # Lightning's SLURM auto-requeue is on: its handler would save hpc_ckpt_N mid-step
            # and requeue behind ckptdash's back. Its signal becomes one of ours instead: the
            # same save at the step boundary, ckptdash's requeue and budget.
            session.also_handle(requeue_signal, "requeue")
        session.signals.install()
        session.announce_signals()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        session = self.session
        if session is None:
            return
        # ModelCheckpoint has resolved its folder by now (in its own setup).
        for cb in getattr(trainer, "checkpoint_callbacks", []):
            dirpath = getattr(cb, "dirpath", None)
            if dirpath:
                session.declare_checkpoint_dir(dirpath)
        self._take_signals_over(trainer, session)
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
        with self._saving(decision.trigger):
            try:
                trainer.save_checkpoint(path)
                # With AsyncCheckpointIO the save is only queued: wait until it is written
                # before answering commands or requeueing (SLURM kills the job right after).
                _flush_async(trainer.strategy.checkpoint_io)
            except Exception as exc:
                session.save_failed(exc)
                raise
        session.after_save(None, str(path))
        if session.stop_reason is not None:
            trainer.should_stop = True

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
                _flush_async(trainer.strategy.checkpoint_io)
            session.close()
        else:
            session.signals.uninstall()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.session is None:
            return
        self._stop_timed_checks()
        io = trainer.strategy.checkpoint_io
        if isinstance(io, _TaggingCheckpointIO):
            # Let queued async saves finish so their events are written before we close.
            with contextlib.suppress(Exception):
                io.inner.teardown()
        if isinstance(io, RecordingCheckpointIO) and io.saver is not None:
            io.saver.wait()  # a failed one is already a checkpoint_failed event
        session, self.session = self.session, None
        session.close(_end_reason(trainer), error=self._error)
        self._error = None
