"""ckptdash: see and steer checkpoints, preemption signals and requeues of PyTorch training.

The Lightning callback lives in :mod:`ckptdash.lightning` so that importing
ckptdash never imports Lightning; :func:`dashboard` is imported on first use
so that importing ckptdash never imports Panel.
"""

from typing import TYPE_CHECKING, Any

from ckptdash.badput import RunGoodput, goodput
from ckptdash.errors import CkptDashError, EventValidationError, RunDirError
from ckptdash.resume import ResumeChoice, choose_resume, resume_path
from ckptdash.rundir import RunDir, atomic_write
from ckptdash.train.config import TrainConfig
from ckptdash.train.monitor import Monitor
from ckptdash.writer import EventWriter

if TYPE_CHECKING:
    from ckptdash.dash.app import dashboard

__all__ = [
    "CkptDashError",
    "EventValidationError",
    "EventWriter",
    "Monitor",
    "ResumeChoice",
    "RunDir",
    "RunDirError",
    "RunGoodput",
    "TrainConfig",
    "atomic_write",
    "choose_resume",
    "dashboard",
    "goodput",
    "resume_path",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "dashboard":  # Panel loads only when the dashboard is asked for
        from ckptdash.dash.app import dashboard

        return dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
