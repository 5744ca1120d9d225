"""Reading runs from a notebook or a script: the public read API.

Every function takes a run directory as a path and replays its event log afresh, so each call
sees what the job has written up to now::

    import ckptdash, pandas as pd

    state = ckptdash.load_state("runs/exp1")          # the replayed run (attempts, checkpoints...)
    print(ckptdash.status("runs/exp1"))               # what `ckptdash status RUN` prints
    pd.DataFrame(ckptdash.checkpoints("runs/exp1"))   # one row per checkpoint, newest first
    ckptdash.alerts("runs/exp1")                      # the health alerts that hold now
    ckptdash.goodput("runs/exp1")                     # where the time went, and the preemption cost

These are what ``ckptdash status``, ``ckptdash health`` and ``ckptdash goodput`` compute, with the
same thresholds (the run's own, from ``control/settings.json``) and the same resume rule.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ckptdash.analysis.health import Alert
from ckptdash.rundir import RunDir
from ckptdash.state.checkpoints import checkpoint_order
from ckptdash.state.checkpoints import kind as checkpoint_kind
from ckptdash.state.reading import load_state

__all__ = ["alerts", "checkpoints", "load_state", "status", "write_sample_run"]

RunPath = str | os.PathLike[str]


def status(run_dir: RunPath, now: float | None = None) -> str:
    """What ``ckptdash status RUN_DIR`` prints for one run (without asking SLURM)."""
    from ckptdash.cli.status import render_status  # the CLI's tables: loaded when asked for

    run = RunDir(run_dir)
    return render_status(run, load_state(run), now=now)


def checkpoints(run_dir: RunPath) -> list[dict[str, Any]]:
    """Every checkpoint the run recorded, newest first, one dict per path (``pd.DataFrame`` it).

    Keys: ``step``, ``epoch``, ``trigger``, ``status`` (``saved`` is a resume candidate;
    ``invalid``/``failed``/``removed`` say why not in ``reason``), ``size_bytes``,
    ``duration_s``, ``blocking_s`` (how long training stalled), ``saved_at`` (Unix time),
    ``attempt``, ``path`` (relative to the run directory where it lies inside it), ``reason``,
    ``resumes`` (True: it resumes training; False: an artifact, never a resume candidate),
    ``artifact`` (why not, "" when it resumes), ``kind`` (``resumes``, ``artifact``, or
    ``= NAME``: a link to or copy of the checkpoint ``NAME``, e.g. Lightning's ``last.ckpt``).
    """
    run = RunDir(run_dir)
    state = load_state(run)
    rows = []
    for c in sorted(state.checkpoints.values(), key=checkpoint_order, reverse=True):
        rows.append(
            {
                "step": c.step,
                "epoch": c.epoch,
                "trigger": c.trigger,
                "status": c.status,
                "size_bytes": c.size_bytes,
                "duration_s": c.duration_s,
                "blocking_s": c.blocking_s,
                "saved_at": c.t,
                "attempt": c.attempt,
                "path": _relative(c.path, run.root),
                "reason": c.reason or c.error,
                "resumes": c.resumable,
                "artifact": c.artifact,
                "kind": checkpoint_kind(c, state.checkpoints),
            }
        )
    return rows


def alerts(run_dir: RunPath, now: float | None = None) -> list[Alert]:
    """The health alerts that hold for the run at ``now`` (default: the current time), with the
    run's own thresholds, as ``ckptdash health RUN_DIR`` reports them."""
    from ckptdash import control
    from ckptdash.analysis import health

    run = RunDir(run_dir)
    th = health.resolve_thresholds(control.read_settings(run).health, {}, str(run.settings))
    return health.detect(load_state(run), th, time.time() if now is None else now)


def write_sample_run(run_dir: RunPath) -> Path:
    """Write a realistic sample run (a three-hour SLURM job: preempted, requeued, killed,
    resumed) into ``run_dir``, to try the read API and the dashboard without a cluster."""
    from ckptdash._dev.sample import write_sample_run as write

    write(Path(run_dir))
    return Path(run_dir)


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path
