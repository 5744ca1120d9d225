"""Every exception ckptdash raises on purpose.

    CkptDashError
    ├── EventValidationError   an event that breaks the schema was about to be written
    ├── RunDirError            a path is not a usable run directory (missing, empty, unreadable)
    ├── ControlError           a command or the settings file cannot be written or read
    │   └── MalformedControlFile   a command/settings file on disk does not parse
    │       └── UnreadableControlFile  it could not be read (permissions); may work later
    ├── CheckpointChoiceError  the checkpoint the user asked to resume from is not valid
    │   └── CheckpointMismatchError  the chosen checkpoint does not fit the model
    ├── AtomicWriteError       an atomic write could not complete (the old file is intact)
    ├── NotARegularFile        a run-directory file is a link, FIFO, device or folder, or too big
    ├── EventWriteError        an event could not be appended (disk full, permissions, I/O)
    ├── SaveError              a save through Monitor.saving() was not published
    ├── ConfigError            a TrainConfig value is wrong
    ├── WrongFrameworkError    one framework's ckptdash piece given to another framework
    ├── FrameworkVersionError  a framework release without an internal ckptdash relies on
    ├── ThresholdError         a health threshold is wrong
    └── SchedulerError         a scheduler's command failed or was refused (any scheduler)
        ├── SchedulerUnavailable   its commands cannot be used from this machine
        ├── SchedulerRefused       the job is not the acting user's, or not the run's own
        └── SlurmError             the same, from SLURM (ckptdash.schedulers.slurm_queue)
            ├── SlurmUnavailable   (also a SchedulerUnavailable)
            └── SlurmRefused       (also a SchedulerRefused)

The tree is the whole hierarchy, so ``except CkptDashError`` catches every deliberate error.

Messages name the file or value that is wrong and say how to fix it, because
they are usually read by someone on a login node who did not write the code.
"""

from __future__ import annotations


class CkptDashError(Exception):
    """Base class of every error ckptdash raises deliberately."""


class EventValidationError(CkptDashError, ValueError):
    """An event does not match the schema; raised at write time, never at read time."""


class RunDirError(CkptDashError):
    """A path is not a run directory ckptdash can use."""


class ControlError(CkptDashError):
    """A command or a setting cannot be created or read."""


class MalformedControlFile(ControlError):
    """A command or settings file exists but does not parse as the format says."""


class UnreadableControlFile(MalformedControlFile):
    """A command or settings file exists but cannot be read now (permissions, I/O)."""


class CheckpointChoiceError(CkptDashError, ValueError):
    """The checkpoint given to resume from (``fit(ckpt_path=...)``) fails validation; the
    message names it, why, and the newest valid checkpoint to use instead."""


class CheckpointMismatchError(CheckpointChoiceError):
    """The checkpoint the attempt resumed from does not fit the model (a shape mismatch, a
    checkpoint of another framework); the message names it and how to start fresh."""


class AtomicWriteError(CkptDashError, OSError):
    """An atomic write failed; the previous file of that name is untouched."""


class NotARegularFile(CkptDashError, OSError):
    """A file read from a run directory is refused unread: a symbolic link where the file is
    the run's own, a FIFO, a device, a socket, a directory, or larger than it may be
    (:mod:`ckptdash.rundir.safe_read`). An ``OSError``, so it is reported wherever an unreadable
    file is:
    ``strerror`` says which of these it is, ``filename`` names it."""


class EventWriteError(CkptDashError, OSError):
    """An event could not be written to the log (disk full, permissions, I/O error).

    The log stays readable: a partly written line is cut back, so the next event
    starts on a line of its own. The action the event describes is not recorded.
    """


class SaveError(CkptDashError):
    """A save through :meth:`~ckptdash.Monitor.saving` was not published: this rank's or
    another rank's writing failed. Nothing was renamed into place; the previous checkpoint
    of that name is intact."""


class ConfigError(CkptDashError, ValueError):
    """A configuration value is wrong; the message says which and what to use instead."""


class WrongFrameworkError(CkptDashError, TypeError):
    """A ckptdash piece made for one framework was given to another (the Trainer callback to
    Lightning Fabric); the message names the piece to use instead."""


class FrameworkVersionError(CkptDashError, RuntimeError):
    """A framework release lacks an internal that ckptdash's compat module for it relies on
    (``ckptdash/lightning/compat.py``, ``ckptdash/dash/compat.py``); the message names the
    internal, the releases it was tested with, and the pin to use."""


class ThresholdError(CkptDashError, ValueError):
    """A health threshold is wrong; the message names it and the values allowed."""


class SchedulerError(CkptDashError):
    """A scheduler's command about one job failed or does not apply; the message names the
    scheduler, the job and what to do (callers that serve every scheduler catch this)."""


class SchedulerUnavailable(SchedulerError):
    """The scheduler's client commands cannot be used from this machine: callers treat it as
    "no scheduler view", not as a broken job."""


class SchedulerRefused(SchedulerError):
    """ckptdash will not act on this job: the scheduler says another account owns it, or the
    run's log names it without the run's own files vouching for it
    (see :mod:`ckptdash.schedulers.evidence`)."""


class SlurmError(SchedulerError):
    """A SLURM command about one job failed or does not apply; the message says what to do."""


class SlurmUnavailable(SlurmError, SchedulerUnavailable):
    """SLURM's client commands cannot be used from this machine."""


class SlurmRefused(SlurmError, SchedulerRefused):
    """ckptdash will not act on this SLURM job (see :class:`SchedulerRefused`)."""
