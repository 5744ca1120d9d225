"""One run, not one per attempt, in the experiment loggers people read their curves in.

A preempted and requeued job is one experiment, but TensorBoard, W&B, MLflow and a CSV file
each see a new run per attempt unless told otherwise, and the steps an attempt redoes after
its resume point appear twice. ckptdash knows the two facts every logger needs:

* the run's stable identity (``run_id`` in ``run.json``), from which each logger's version
  or run id is derived (:func:`derived_id`): the same in every attempt;
* the step the attempt resumes from: the steps after it are replaced (TensorBoard's
  ``purge_step``, a CSV file rewritten) or, where a logger cannot replace, not logged again
  up to the highest step logged before (:class:`DropUntil`).

Which logger run belongs to the run is recorded as a ``logger_attached`` event (shown by
``ckptdash status`` and the dashboard); an id ckptdash cannot choose (an MLflow run id is
made by its tracking store) is read back from there by the next attempt
(:func:`recorded_loggers`). Nothing here runs per step. See ``docs/loggers.md``.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from ckptdash.events import LoggerAttached, decode_lines
from ckptdash.rundir import RunDir, atomic_write, door
from ckptdash.train.tracking import wandb_compat

ID_PREFIX: Final = "ckptdash-"
"""Derived versions and run ids read ``ckptdash-<run id>``: whose they are shows in any list."""

REPLACED: Final = "replaced"
DROPPED: Final = "dropped"

_KIND_MARK: Final = b'"kind":"logger_attached"'
EVENT_FILE_CAP: Final = 1 << 32
"""An event file larger than this is not scanned for logger records."""
CSV_CAP: Final = 1 << 31
"""A kept metrics CSV larger than this is not read back."""


def derived_id(run_id: str) -> str:
    """The version / run id every attempt of run ``run_id`` logs under (letters, digits, ``-``:
    valid for TensorBoard and CSV folders, W&B run ids and MLflow run names)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in run_id)
    return f"{ID_PREFIX}{safe}"


def purge_step(resume_step: int | None) -> int:
    """The first step whose earlier values the attempt logs again, for a loop that logs a
    step's values under that step's number and saves after logging them: the one after the
    resume point, or 0 on a fresh start (every step is run again). (Lightning logs a batch's
    values under the ``global_step`` it started at: there it is the resume step itself.)"""
    return 0 if not resume_step else resume_step + 1


def recorded_loggers(run: RunDir) -> dict[str, LoggerAttached]:
    """The newest ``logger_attached`` of each logger name in the run's event files.

    Read before an attempt's session starts (a logger's run must be chosen before its
    framework opens it), so only lines of that kind are decoded; a record of another run
    (``run`` not this run's id) or an unreadable line is skipped, as every reader does.
    """
    run_id = run.info().run_id
    newest: dict[str, LoggerAttached] = {}
    for path in run.event_files():
        try:  # never a FIFO, a device or a link: the one door (ckptdash.rundir.door)
            data = door.read_path(path, EVENT_FILE_CAP)
        except OSError:
            continue
        if _KIND_MARK not in data:
            continue
        end = data.rfind(b"\n") + 1  # a last line without its newline is not parsed
        lines = b"\n".join(line for line in data[:end].split(b"\n") if _KIND_MARK in line)
        for ev in decode_lines(lines + b"\n", str(path)):
            if not isinstance(ev, LoggerAttached) or ev.run != run_id:
                continue
            known = newest.get(ev.logger)
            if known is None or (ev.t, ev.attempt) >= (known.t, known.attempt):
                newest[ev.logger] = ev
    return newest


def clash_line(logger: str, given: str, recorded: str) -> str:
    """What a user who named a logger's id is told when the run logged under another one."""
    return (
        f"ckptdash: {logger} logs into {given!r} as you set it; earlier attempts of this run"
        f" logged into {recorded!r} (leave the id unset to continue that one)"
    )


# --- W&B's service ------------------------------------------------------------------------------

WANDB_SERVICE: Final = "WANDB_SERVICE"


def own_wandb_service(again: bool) -> str | None:
    """Before ``wandb.init`` resumes the run id ckptdash chose, in an attempt after the first:
    when ``WANDB_SERVICE`` names a W&B service another process started (a launcher that
    restarts its workers, a parent that called ``wandb.setup()``), take it out of this
    process's environment, so that W&B starts this attempt's own service. ``again``: the run
    had an earlier attempt.

    A W&B service keeps a run open until the process that began it calls ``finish``: an
    attempt killed on the way (SIGKILL, OOM) leaves it open for as long as the service
    lives, and the next attempt's ``wandb.init`` of the same id in that service is refused
    (``run ID ckptdash-... is in use``). Returns the line told on stderr, or None (nothing
    to do: no such variable, this process's own service, a first attempt)."""
    token = os.environ.get(WANDB_SERVICE)
    if not token or not again:  # no earlier attempt: nothing of this run can be open
        return None
    fields = token.split("-")
    owner = fields[1] if len(fields) > 2 else ""
    if not owner.isdigit() or int(owner) == os.getpid():
        return None
    if wandb_compat.service_connected():
        line = (
            f"ckptdash: W&B is already connected to the service {WANDB_SERVICE} names (started"
            f" by process {owner}); if an earlier attempt of this run was killed while logging"
            " to it, wandb.init refuses its run id ('is in use'): call wandb.setup() only"
            " after ckptdash has named the run, or unset WANDB_SERVICE"
        )
    else:
        del os.environ[WANDB_SERVICE]
        line = (
            f"ckptdash: W&B: this attempt starts its own wandb service instead of the one"
            f" {WANDB_SERVICE} names (started by process {owner}), which may still hold"
            " this run open for an earlier attempt that was killed ('run ID ... is in use')"
        )
    print(line, file=sys.stderr)
    return line


# --- dropping what a logger cannot replace -----------------------------------------------------


def _step_argument(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """``log_metrics(metrics, step)``'s step (Lightning's loggers, ``mlflow.log_metrics``)."""
    return kwargs["step"] if "step" in kwargs else (args[1] if len(args) > 1 else None)


class DropUntil:
    """Wrap a logger's ``log_metrics(metrics, step)`` so steps up to ``last_step`` are dropped.

    A logger that can only append (W&B's history, MLflow's metric history) would show the
    steps an attempt redoes after its resume point twice. The earlier values stay; the
    attempt's values for those steps are not sent. Once a step beyond ``last_step`` is
    logged the wrapper takes itself off (``restore``): no cost for the rest of training.
    ``owner`` is a logger object (the wrapper shadows its method) or a module whose function
    the framework calls (``wandb.log``, ``mlflow.log_metrics``: put back as it was);
    ``step_of(args, kwargs)`` reads a call's step (a call without one goes through, and the
    wrapper stays).
    """

    def __init__(
        self,
        owner: Any,
        last_step: int,
        attr: str = "log_metrics",
        step_of: Callable[[tuple[Any, ...], Mapping[str, Any]], Any] = _step_argument,
    ) -> None:
        self.owner, self.last_step, self.attr, self.step_of = owner, last_step, attr, step_of
        self.original: Callable[..., Any] = getattr(owner, attr)
        self._shadows = attr not in getattr(owner, "__dict__", {})
        self.dropped = 0
        setattr(owner, attr, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        step = self.step_of(args, kwargs)
        if isinstance(step, int):
            if step <= self.last_step:
                self.dropped += 1
                return None
            self.restore()
        return self.original(*args, **kwargs)

    def restore(self) -> None:
        if self.owner.__dict__.get(self.attr) is not self:
            return  # restored, or replaced since (wandb resets its module functions at finish)
        if self._shadows:
            del self.owner.__dict__[self.attr]
        else:
            setattr(self.owner, self.attr, self.original)


# --- CSV ------------------------------------------------------------------------------------------


def truncate_csv(
    path: str | os.PathLike[str],
    first_redone: int,
    *,
    target: str | os.PathLike[str] | None = None,
) -> list[str] | None:
    """Rewrite the metrics CSV at ``path`` (into ``target``, default ``path`` itself) keeping
    only the rows of steps before ``first_redone`` (the attempt logs those after again),
    atomically; returns its header, or None when there is no file. A row whose step cannot
    be read is kept."""
    source = Path(path)
    try:  # the owner's own regular file, one link, never through a link or a FIFO
        text = door.read_path(source, CSV_CAP, own=True).decode(errors="replace")
    except FileNotFoundError:
        return None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = list(reader.fieldnames or [])
    kept = [row for row in reader if _step_of(row) < first_redone]
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=header)
    writer.writeheader()
    writer.writerows(kept)
    atomic_write(source if target is None else Path(target), out.getvalue().encode())
    return header


def _step_of(row: Mapping[str, str | None]) -> float:
    try:
        return float(row.get("step") or "-inf")
    except ValueError:
        return float("-inf")
