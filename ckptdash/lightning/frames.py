"""What Lightning does not keep but its call stack and objects tell: the ``ckpt_path`` the
user gave, whether this runs in a ddp_spawn launcher or under Lightning's interrupt
handling, and why a fit() that ran to its end ended."""

from __future__ import annotations

import inspect
from typing import Any, Final

from ckptdash.lightning.compat import EarlyStopping

UNKNOWN: Final = object()


def given_ckpt_path(trainer: Any) -> Any:
    """The ``ckpt_path`` the user passed to ``trainer.fit`` (before Lightning resolved
    "last", "hpc" or its own defaults), or ``UNKNOWN``. Lightning keeps no copy of it: it is
    read from the caller's frame, or, in a ddp_spawn worker, from the launched call."""
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


def end_reason(trainer: Any) -> str:
    """Why a fit() that ran to its end ended: ``completed``, or ``completed: early stopping
    (<EarlyStopping's message>)`` when an EarlyStopping callback stopped it."""
    for cb in trainer.callbacks:
        message = getattr(cb, "stopping_reason_message", None)  # Lightning >= 2.6
        if isinstance(cb, EarlyStopping) and (cb.stopped_epoch or message):
            return f"completed: early stopping ({message or f'monitor {cb.monitor!r}'})"
    return "completed"


def in_spawn_launcher() -> bool:
    """Whether this runs inside a multiprocessing launcher's ``launch`` (ddp_spawn)."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "launch" and type(owner).__name__ == "_MultiProcessingLauncher":
            return True
        frame = frame.f_back
    return False


def under_lightning_interrupt_handling() -> bool:
    """Whether this fit() runs inside Lightning's ``_call_and_handle_interrupt`` (which calls
    ``on_exception`` on failure); a ddp_spawn worker runs it bare."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "_call_and_handle_interrupt":
            return True
        frame = frame.f_back
    return False
