"""ckptdash: see and steer checkpoints, preemption signals and requeues of PyTorch training."""

from ckptdash.errors import CkptDashError, EventValidationError, RunDirError
from ckptdash.rundir import RunDir, atomic_write
from ckptdash.writer import EventWriter

__all__ = [
    "CkptDashError",
    "EventValidationError",
    "EventWriter",
    "RunDir",
    "RunDirError",
    "atomic_write",
]
__version__ = "0.1.0"
