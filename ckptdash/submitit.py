"""ckptdash for functions submitted with submitit: wrap the function, nothing else.

    from ckptdash.submitit import preemptible

    def train(run_dir: str, steps: int) -> float:
        with ckptdash.Monitor(run_dir, max_steps=steps) as monitor:
            ...                                   # the usual Monitor loop
        return final_loss

    job = executor.submit(preemptible(train), "runs/exp1", 1000)
    job.result()                                  # the completed training's value

Inside a submitit job, ckptdash takes the preemption signal (USR2) over from
submitit's handler, which would requeue and exit inside the handler without a
save. ckptdash saves at the next step boundary, requeues the job (its budget
applies) and the loop stops. The function then returns early, with a partial
value: :func:`preemptible` turns that return into an exit *without a result*,
so submitit writes none and ``job.result()`` waits for the requeued attempt,
which resumes from the signal save and returns the finished training's value.
(A SIGTERM stop, with no requeue by ckptdash, also leaves no result: better none
than a partial one reported as final.)

A function whose loop is a ``with ckptdash.Monitor(...)`` block needs no wrapper: in a
submitit job the Monitor itself exits without a result when a signal stopped its attempt
(leaving the block, or :meth:`~ckptdash.Monitor.close`). The wrapper is needed where the
training is not a Monitor (a Lightning Trainer or HF Trainer callback: ``fit()`` returns
and the function goes on); such an unwrapped job says so in one line at start-up. Inside
the wrapper the Monitor leaves the exit to it, so code after the block still runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ckptdash.train.ending import submitit_job
from ckptdash.train.ending.submitit_job import STOPPED_EXIT_CODE
from ckptdash.train.engine.session import SIGNAL_STOPS

__all__ = ["STOPPED_EXIT_CODE", "Preemptible", "preemptible"]

R = TypeVar("R")


class Preemptible(Generic[R]):
    """A picklable wrapper: calls the function; if a signal stopped its training meanwhile
    (ckptdash saved, and requeued where the policy allowed), exits without returning, so that
    submitit records no result for this attempt: the requeued attempt gives the result, and a
    job killed without requeue ends without a result instead of a partial one."""

    def __init__(self, function: Callable[..., R]) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        before = len(SIGNAL_STOPS)
        with submitit_job.wrapped_call():
            result = self.function(*args, **kwargs)
        if len(SIGNAL_STOPS) > before:
            # SystemExit is not an Exception: submitit's job runner lets it through without
            # writing a result or an error, as its own requeue does.
            raise SystemExit(STOPPED_EXIT_CODE)
        return result

    def __repr__(self) -> str:
        return f"preemptible({self.function!r})"


def preemptible(function: Callable[..., R]) -> Preemptible[R]:
    """Wrap ``function`` for ``executor.submit`` so a ckptdash requeue is not a final result."""
    return Preemptible(function)
