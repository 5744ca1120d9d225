"""Whether this process runs a function that submitit submitted, and whether
:func:`ckptdash.submitit.preemptible` wraps it.

submitit writes whatever the submitted function returns as the job's final result. After a
preemption ckptdash saves, requeues and ends the training loop, so an unwrapped function
would return early and its partial value would become ``job.result()``. A
:class:`~ckptdash.Monitor` ``with`` block in such a job therefore ends a signal-stopped
attempt by exiting without a result as the block is left (the requeued attempt returns
the finished value); where ckptdash cannot end it (a Trainer callback: ``fit()`` returns
and the function goes on; a Monitor outside a ``with`` block) it says at start-up, in one
line, that the function must be wrapped.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

STOPPED_EXIT_CODE = 3
"""Exit status of an attempt that a signal stopped (requeued, or about to be killed)."""

_wrapped_calls = 0  # calls of preemptible-wrapped functions in progress in this process
_warned = False  # the start-up line is said once per process


def in_job() -> bool:
    """Whether this process runs a submitted function: submitit's job script exports
    ``SUBMITIT_EXECUTOR`` and its runner sets ``SUBMITIT_FOLDER`` before calling it (what
    ``submitit.JobEnvironment`` reads too)."""
    return bool(os.environ.get("SUBMITIT_EXECUTOR")) and bool(os.environ.get("SUBMITIT_FOLDER"))


def unwrapped() -> bool:
    """In a submitit job whose function :func:`~ckptdash.submitit.preemptible` does not wrap."""
    return in_job() and _wrapped_calls == 0


@contextlib.contextmanager
def wrapped_call() -> Iterator[None]:
    """Mark a preemptible-wrapped call in progress (nestable)."""
    global _wrapped_calls
    _wrapped_calls += 1
    try:
        yield
    finally:
        _wrapped_calls -= 1


def unwrapped_line(who: str) -> str:
    """The start-up line for ``who`` (a Trainer callback) in an unwrapped submitit job."""
    return (
        f"ckptdash: {who} in a submitit job whose function is not wrapped: after a preemption"
        " its early return would become job.result(); submit"
        " ckptdash.submitit.preemptible(train) instead of train"
    )


def warn_if_unwrapped(who: str, *, lead: bool) -> None:
    """Print :func:`unwrapped_line` on stderr (``lead``: rank 0 only) in an unwrapped job,
    once per process."""
    global _warned
    if lead and not _warned and unwrapped():
        _warned = True
        print(unwrapped_line(who), file=sys.stderr, flush=True)
