"""ckptdash: see and steer checkpoints, preemption signals and requeues of PyTorch training.

The supported modules (what the README and docs/ use; everything else is internal and may
move between releases):

* ``ckptdash`` — this package: :class:`Monitor` for a plain loop, :class:`TrainConfig`,
  the resume rule (:func:`resume_path`, :func:`choose_resume`), the read API for notebooks
  and scripts (:func:`load_state`, :func:`status`, :func:`checkpoints`, :func:`alerts`,
  :func:`goodput`, :func:`write_sample_run`; see :mod:`ckptdash.read`), :func:`dashboard`
  and the exceptions (all of :mod:`ckptdash.errors` derive from :class:`CkptDashError`).
* ``ckptdash.lightning``, ``ckptdash.fabric``, ``ckptdash.hf``, ``ckptdash.accelerate``,
  ``ckptdash.dcp``, ``ckptdash.deepspeed``, ``ckptdash.submitit`` — one module per
  framework; each imports its framework, so each loads only when first named
  (``ckptdash.hf.CkptDashCallback``).
* ``ckptdash.dash`` — the dashboard (Panel), for notebooks and ``panel serve``.
* ``ckptdash.events`` — for readers and writers of the run-directory format
  (docs/format.md): every record, and the lenient reader.
* ``ckptdash.control`` — the control channel's files (commands and settings), for tools that
  write them (docs/format.md).

That list is :data:`PUBLIC_MODULES`, the one list: ``tests/test_public_api.py`` checks the
notebooks and docs against it and docs/architecture.md names the same modules. What the read
API returns is exported too (:class:`RunState` from :func:`load_state`, :class:`Alert` from
:func:`alerts`, :class:`RunGoodput` from :func:`goodput`).

:func:`dashboard` is imported on first use so that importing ckptdash never imports Panel.

Not in ``__all__``, though importable here as before: ``RunDir`` and ``atomic_write``
(home :mod:`ckptdash.rundir`) and ``EventWriter`` (home :mod:`ckptdash.rundir.writer`). Every
public function takes the run directory as a path, so ``RunDir`` is a layout helper; a file
saved with ``atomic_write`` is durable but recorded nowhere (no ``checkpoint_saved``, so the
dashboard and the resume rule never see it: save through :meth:`Monitor.saving`); and the
events of a run are written by its :class:`Monitor` or framework callback, one writer per
rank, so a second ``EventWriter`` from user code would only compete with it.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ckptdash.analysis.goodput import RunGoodput, goodput
from ckptdash.analysis.health import Alert
from ckptdash.errors import (
    CheckpointChoiceError,
    CkptDashError,
    EventValidationError,
    RunDirError,
    SaveError,
)
from ckptdash.read import alerts, checkpoints, load_state, status, write_sample_run
from ckptdash.resume import ResumeChoice, choose_resume, resume_path
from ckptdash.state import RunState
from ckptdash.train.config import ConfigError, TrainConfig
from ckptdash.train.monitor import Monitor

if TYPE_CHECKING:
    from ckptdash.dash.app import dashboard

__all__ = [
    "Alert",
    "CheckpointChoiceError",
    "CkptDashError",
    "ConfigError",
    "EventValidationError",
    "Monitor",
    "ResumeChoice",
    "RunDirError",
    "RunGoodput",
    "RunState",
    "SaveError",
    "TrainConfig",
    "alerts",
    "checkpoints",
    "choose_resume",
    "dashboard",
    "goodput",
    "load_state",
    "resume_path",
    "status",
    "write_sample_run",
]
__version__ = "0.1.0"

PUBLIC_MODULES = (
    "ckptdash",
    "ckptdash.accelerate",
    "ckptdash.control",
    "ckptdash.dash",
    "ckptdash.dcp",
    "ckptdash.deepspeed",
    "ckptdash.events",
    "ckptdash.fabric",
    "ckptdash.hf",
    "ckptdash.lightning",
    "ckptdash.submitit",
)
"""The supported modules (above); everything else may move between releases."""


# The framework modules import their framework; they load when first named
# (``ckptdash.hf.CkptDashCallback``), so ``import ckptdash`` stays light.
_FRAMEWORK_MODULES = frozenset(
    {"accelerate", "dcp", "deepspeed", "fabric", "hf", "lightning", "submitit"}
)


def __getattr__(name: str) -> Any:
    if name == "dashboard":  # Panel loads only when the dashboard is asked for
        from ckptdash.dash.app import dashboard

        return dashboard
    if name in _FRAMEWORK_MODULES:
        return importlib.import_module(f"ckptdash.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
