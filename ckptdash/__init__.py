"""ckptdash: see and steer checkpoints, preemption signals and requeues of PyTorch training.

The Lightning callback lives in :mod:`ckptdash.lightning` so that importing
ckptdash never imports Lightning.
"""

from ckptdash.errors import CkptDashError, EventValidationError, RunDirError
from ckptdash.resume import ResumeChoice, choose_resume, resume_path
from ckptdash.rundir import RunDir, atomic_write
from ckptdash.train.config import TrainConfig
from ckptdash.train.monitor import Monitor
from ckptdash.writer import EventWriter

__all__ = [
    "CkptDashError",
    "EventValidationError",
    "EventWriter",
    "Monitor",
    "ResumeChoice",
    "RunDir",
    "RunDirError",
    "TrainConfig",
    "atomic_write",
    "choose_resume",
    "resume_path",
]
__version__ = "0.1.0"
