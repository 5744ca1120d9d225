"""Every touch of Lightning's private API, in one place, with the releases it was written for.

Written and tested for Lightning 2.6.1 (pyproject's lower bound, ``make test-compat``)
through 2.6.6 (constraints-dev.txt), as ``lightning.pytorch`` or, if that is missing,
``pytorch_lightning``; Lightning Fabric of the same releases. Older releases, tried with torch
2.13 (2026-12-03): the Trainer's tests pass on 2.4.0, but Fabric's ``load`` has no
``weights_only`` before 2.6.1 (it unpickles anything: ``FabricMonitor.load`` could not keep
its promise); 2.2 and 2.3 import ``pkg_resources``, which setuptools no longer ships.

Lightning gives a callback no public way to learn the ``ckpt_path`` a user gave, to take the
resume choice, to see its loggers' versions before they open, or to tell which code path
saved a checkpoint; ckptdash reads or wraps the internals below. The rest of the package
calls these functions and never names a private attribute of Lightning
(``tests/test_compat.py`` fails when one does). Each function says what it touches and what
happens when a release no longer has it: a :class:`~ckptdash.errors.FrameworkVersionError`
naming the internal and the tested releases, or a fallback stated in its docstring — never a
silently wrong answer. A new Lightning release is supported by running ``make test-compat``
and the Lightning tests against it and fixing this module alone.

The call-stack readers (:func:`given_ckpt_path`, :func:`in_spawn_launcher`,
:func:`under_lightning_interrupt_handling`, :func:`saving_callback`) look for Lightning's
function and class names in the frames above them; the function-name strings are private
names too, and live here for the same reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Final

from ckptdash.errors import FrameworkVersionError

__all__ = [
    "UNKNOWN",
    "AsyncCheckpointIO",
    "CheckpointIO",
    "DeepSpeedStrategy",
    "EarlyStopping",
    "FSDPStrategy",
    "ModelCheckpoint",
    "ModelParallelStrategy",
    "OnExceptionCheckpoint",
    "Strategy",
    "TorchCheckpointIO",
    "pl",
]

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
    from lightning.pytorch.strategies import (
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        Strategy,
    )
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
    from pytorch_lightning.strategies import (  # type: ignore[assignment,unused-ignore]
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        Strategy,
    )

TESTED: Final = "Lightning 2.6.1 to 2.6.6"
"""The releases this module was written and tested for (said in every error it raises)."""

UNKNOWN: Final = object()
"""What a call-stack reader returns when the stack does not tell."""

_MARK: Final = "_ckptdash"
"""Set on each wrapper ckptdash installs, so that a second install leaves the first alone."""


def _missing(owner: Any, name: str) -> FrameworkVersionError:
    """The error for an internal this Lightning release does not have."""
    where = owner.__name__ if isinstance(owner, type) else type(owner).__name__
    return FrameworkVersionError(
        f"ckptdash: Lightning's {where}.{name} is missing in this release (ckptdash relies on"
        f" it; tested with {TESTED}): install a tested release (pip install 'lightning<=2.6.6')"
        " or report the version at ckptdash's issue tracker"
    )


def _private(owner: Any, name: str) -> Any:
    """``owner.<name>``, or :class:`FrameworkVersionError` when this release has no such thing."""
    try:
        return getattr(owner, name)
    except AttributeError:
        raise _missing(owner, name) from None


def _wrap_once(owner: Any, name: str, wrap: Callable[[Any], Any]) -> None:
    """Replace ``owner.<name>`` by ``wrap(original)`` unless a ckptdash wrapper is there."""
    original = _private(owner, name)
    if getattr(original, _MARK, False):
        return
    wrapper = wrap(original)
    setattr(wrapper, _MARK, True)
    # A bound method pickles as (instance, its function's __name__): under ddp_spawn the
    # Trainer's wrapped method travels to each worker by that name, which must be the
    # attribute's, or the worker fails to unpickle it ("no attribute 'fit_impl'").
    wrapper.__name__ = name
    wrapper.__qualname__ = f"{getattr(owner, '__qualname__', type(owner).__name__)}.{name}"
    setattr(owner, name, wrapper)


def is_wrapped(function: Any) -> bool:
    """Whether ``function`` is a wrapper ckptdash installed (on Lightning's or the strategy's)."""
    return bool(getattr(function, _MARK, False))


def mark_wrapped(function: Any) -> Any:
    """Mark ``function`` as ckptdash's wrapper (see :func:`is_wrapped`); returns it."""
    setattr(function, _MARK, True)
    return function


# --- the Trainer ---------------------------------------------------------------------------------


def wrap_fit_impl(wrap: Callable[[Any], Any]) -> None:
    """Wrap ``Trainer._fit_impl`` (once per process): it resolves ``ckpt_path`` before any
    callback hook runs. Missing: :class:`FrameworkVersionError` at the callback's creation."""
    _wrap_once(pl.Trainer, "_fit_impl", wrap)


def wrap_run(wrap: Callable[[Any], Any]) -> None:
    """Wrap ``Trainer._run`` (once per process): it runs before Lightning opens any logger's
    experiment. Missing: :class:`FrameworkVersionError` at the callback's creation."""
    _wrap_once(pl.Trainer, "_run", wrap)


def wrap_run_stage(trainer: Any, wrap: Callable[[Any], Any]) -> None:
    """Wrap this trainer's ``_run_stage`` (the stage a bare ddp_spawn worker runs).
    Missing: :class:`FrameworkVersionError`."""
    trainer._run_stage = wrap(_private(trainer, "_run_stage"))


def checkpoint_connector(trainer: Any) -> Any:
    """``trainer._checkpoint_connector``: its public methods ``resume_start``,
    ``restore_model`` and ``restore_training_state`` load a checkpoint. Missing:
    :class:`FrameworkVersionError` (resume could not be taken over)."""
    return _private(trainer, "_checkpoint_connector")


def connector_ckpt_path(connector: Any) -> Any:
    """The path the connector is loading (``_ckpt_path``); None when it has none (fallback:
    a failed load is then reported as Lightning's own error, without the path)."""
    return getattr(connector, "_ckpt_path", None)


def loaded_checkpoint(connector: Any) -> dict[str, Any]:
    """The checkpoint dict the connector read (``_loaded_checkpoint``); ``{}`` when it holds
    none (fallback: the resume is recorded without its step, the weights-only check skipped)."""
    loaded = getattr(connector, "_loaded_checkpoint", None)
    return loaded if isinstance(loaded, dict) else {}


def cluster_environment(trainer: Any) -> Any:
    """The trainer's cluster environment (``_accelerator_connector.cluster_environment``),
    or None (fallback: Lightning's SLURM auto-requeue signal is not taken over, and its own
    handler stays in place, as without ckptdash)."""
    connector = getattr(trainer, "_accelerator_connector", None)
    return getattr(connector, "cluster_environment", None)


def skip_hook(callback: Any, name: str) -> None:
    """Let Lightning skip the hook ``name`` of ``callback``: its dispatcher calls a hook
    attribute only when it is callable. Where a release calls it anyway, the call raises
    ``TypeError`` (a clear error, not a wrong answer)."""
    setattr(callback, name, None)


# --- checkpoint IO and strategies ----------------------------------------------------------------


def set_async_inner(io: Any, inner: Any) -> None:
    """Make ``AsyncCheckpointIO`` write through ``inner`` (its ``_checkpoint_io``, the IO
    its worker thread calls). Missing: :class:`FrameworkVersionError`."""
    _private(io, "_checkpoint_io")
    io._checkpoint_io = inner


def flush_async_io(io: Any) -> None:
    """Wait until every save an ``AsyncCheckpointIO`` queued is written (its one-worker
    ``_executor``), then re-raise a failed one (its ``_error``). Without an executor (not yet
    started or torn down) nothing is queued: returns."""
    executor = getattr(io, "_executor", None)
    if executor is not None:
        executor.submit(lambda: None).result()  # one worker, in order: queued saves are done
    error = getattr(io, "_error", None)
    if error is not None:
        raise error


def writes_shards(strategy: Any) -> bool:
    """Whether ``strategy`` saves a directory of shards on every rank instead of through its IO,
    by class (a renamed subclass too): DeepSpeed always; FSDP when its ``_state_dict_type`` is
    ``"sharded"``; ModelParallel when its ``_save_distributed_checkpoint`` is set. Missing
    attribute (fallback): that strategy saves through its IO, which ckptdash records.

    >>> writes_shards(FSDPStrategy(state_dict_type="sharded"))
    True
    """
    if isinstance(strategy, DeepSpeedStrategy):
        return True
    if isinstance(strategy, FSDPStrategy):
        return getattr(strategy, "_state_dict_type", None) == "sharded"
    if isinstance(strategy, ModelParallelStrategy):
        return getattr(strategy, "_save_distributed_checkpoint", False) is True
    return False


# --- ModelCheckpoint -----------------------------------------------------------------------------


def wrap_link_checkpoint(cb: Any, wrap: Callable[[Any], Any]) -> None:
    """Wrap this ModelCheckpoint's ``_link_checkpoint`` (how ``save_last="link"`` updates
    ``last.ckpt``), once. Missing: nothing is wrapped (fallback: a release without it makes
    no links, so there is nothing to record)."""
    if "_link_checkpoint" in vars(cb) or not hasattr(cb, "_link_checkpoint"):
        return
    cb._link_checkpoint = wrap(cb._link_checkpoint)


def last_saved(cb: Any) -> Any:
    """The ``last.ckpt`` this ModelCheckpoint saved this attempt (``_last_checkpoint_saved``).
    Missing: :class:`FrameworkVersionError`."""
    return _private(cb, "_last_checkpoint_saved")


def mark_last_saved(cb: Any, path: str, step: int) -> None:
    """Tell this ModelCheckpoint its ``last.ckpt`` is saved at ``step``, so that its
    ``on_train_end`` writes no other (``_last_checkpoint_saved``, ``_last_global_step_saved``)."""
    last_saved(cb)
    cb._last_checkpoint_saved = path
    cb._last_global_step_saved = step


def monitor_candidates(cb: Any, trainer: Any) -> dict[str, Any]:
    """The metrics this ModelCheckpoint formats its file names with (``_monitor_candidates``).
    Missing: :class:`FrameworkVersionError`."""
    candidates: dict[str, Any] = _private(cb, "_monitor_candidates")(trainer)
    return candidates


# --- loggers: what each Lightning logger holds before it opens -----------------------------------


def logger_version(logger: Any) -> Any:
    """TensorBoardLogger's and CSVLogger's ``_version`` (None until resolved)."""
    return _private(logger, "_version")


def set_logger_version(logger: Any, version: str) -> None:
    """Name the version folder before the logger resolves one (``_version``)."""
    logger_version(logger)
    logger._version = version


def logger_name(logger: Any) -> Any:
    """TensorBoardLogger's ``_name`` (None where a release has none: fallback)."""
    return getattr(logger, "_name", None)


def experiment_opened(logger: Any) -> bool:
    """Whether the logger opened its experiment (``_experiment``); False where a release has
    none (fallback: ckptdash then names it, as for a logger not yet opened)."""
    return getattr(logger, "_experiment", None) is not None


def opened_experiment(logger: Any) -> Any:
    """The experiment the logger opened (``_experiment``), or None: no experiment is opened
    for the asking (``logger.experiment`` would open one)."""
    return getattr(logger, "_experiment", None)


def wandb_id(logger: Any) -> Any:
    """WandbLogger's run id (``_id``; None until given or opened)."""
    return _private(logger, "_id")


def set_wandb_id(logger: Any, run_id: str) -> None:
    """Give WandbLogger its run id before it opens (``_id`` and ``_wandb_init["id"]``),
    resumed when it exists (``resume="allow"`` unless the user chose otherwise)."""
    init = _private(logger, "_wandb_init")
    wandb_id(logger)
    logger._id = init["id"] = run_id
    init.setdefault("resume", "allow")


def wandb_project(logger: Any) -> str:
    """WandbLogger's project (``_project``), ``""`` where a release has none (fallback)."""
    return str(getattr(logger, "_project", None) or "")


def mlflow_run_id(logger: Any) -> Any:
    """MLFlowLogger's run id (``_run_id``; None until created)."""
    return _private(logger, "_run_id")


def set_mlflow_run_id(logger: Any, run_id: str) -> None:
    """Make MLFlowLogger log into the existing run ``run_id`` (``_run_id``)."""
    mlflow_run_id(logger)
    logger._run_id = run_id


def mlflow_initialized(logger: Any) -> bool:
    """Whether MLFlowLogger created its run (``_initialized``; False where absent: fallback)."""
    return bool(getattr(logger, "_initialized", False))


def mlflow_run_name(logger: Any) -> Any:
    """MLFlowLogger's run name (``_run_name``; None until given)."""
    return _private(logger, "_run_name")


def set_mlflow_run_name(logger: Any, name: str) -> None:
    """Name the MLflow run before it is created (``_run_name``)."""
    mlflow_run_name(logger)
    logger._run_name = name


def mlflow_client(logger: Any) -> Any:
    """MLFlowLogger's client (``_mlflow_client``), without creating the run."""
    return _private(logger, "_mlflow_client")


def mlflow_tracking_uri(logger: Any) -> str:
    """MLFlowLogger's tracking URI (``_tracking_uri``), ``""`` where absent (fallback: the
    location shown is empty and a stored run id is reused as if the store were the same)."""
    return str(getattr(logger, "_tracking_uri", "") or "")


def tensorboard_file_writer(writer: Any) -> Any:
    """The event file writer of an open ``SummaryWriter`` (torch's or tensorboardX's
    ``_get_file_writer()``). Missing: :class:`FrameworkVersionError`."""
    get: Callable[[], Any] = _private(writer, "_get_file_writer")
    return get()


# --- Fabric --------------------------------------------------------------------------------------


def fabric_launched(fabric: Any) -> bool:
    """Whether ``fabric.launch()`` ran (Fabric's ``_launched``); True where a release has
    none (fallback: the check that it ran is skipped)."""
    return getattr(fabric, "_launched", True) is not False


# --- what Lightning's call stack says ------------------------------------------------------------


def given_ckpt_path(trainer: Any) -> Any:
    """The ``ckpt_path`` the user passed to ``trainer.fit`` (before Lightning resolved
    "last", "hpc" or its own defaults), or ``UNKNOWN``. Lightning keeps no copy of it: it is
    read from ``fit``'s frame, or, in a ddp_spawn worker, from the launcher's
    ``_wrapping_function`` call of ``_fit_impl`` (its fifth argument). ``UNKNOWN`` where
    neither is found: the caller then treats the path as not given by the user."""
    frame = inspect.currentframe()
    while frame is not None:
        code, local = frame.f_code.co_name, frame.f_locals
        if code == "fit" and local.get("self") is trainer and "ckpt_path" in local:
            return local["ckpt_path"]
        if code == "_wrapping_function":  # fit's arguments, as the launcher passed them on
            function, args = local.get("function"), local.get("args")
            if getattr(function, "__name__", "") == "_fit_impl" and isinstance(args, tuple):
                return args[4] if len(args) >= 5 else UNKNOWN
        frame = frame.f_back
    return UNKNOWN


def in_spawn_launcher() -> bool:
    """Whether this runs inside ``_MultiProcessingLauncher.launch`` (ddp_spawn's launcher).
    False where the class is renamed (fallback: the launcher's signals are not forwarded)."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "launch" and type(owner).__name__ == "_MultiProcessingLauncher":
            return True
        frame = frame.f_back
    return False


def under_lightning_interrupt_handling() -> bool:
    """Whether this fit() runs inside Lightning's ``_call_and_handle_interrupt`` (which calls
    ``on_exception`` on failure); a ddp_spawn worker runs it bare. False where the function
    is renamed (fallback: the stage is guarded as well, so a failure is still recorded)."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "_call_and_handle_interrupt":
            return True
        frame = frame.f_back
    return False


def saving_callback() -> Any:
    """The OnExceptionCheckpoint or ModelCheckpoint whose method is saving now (the nearest
    ``self`` up the stack that is one), or None: the user's own ``save_checkpoint`` call."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, (OnExceptionCheckpoint, ModelCheckpoint)):
            return owner
        frame = frame.f_back
    return None


def end_reason(trainer: Any) -> str:
    """Why a fit() that ran to its end ended: ``completed``, or ``completed: early stopping
    (<EarlyStopping's message>)`` when an EarlyStopping callback stopped it. The message is
    ``stopping_reason_message`` (Lightning >= 2.6); older releases (fallback) name the monitor."""
    for cb in trainer.callbacks:
        message = getattr(cb, "stopping_reason_message", None)
        if isinstance(cb, EarlyStopping) and (cb.stopped_epoch or message):
            return f"completed: early stopping ({message or f'monitor {cb.monitor!r}'})"
    return "completed"
