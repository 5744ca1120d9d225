"""The one way to open a run for reading: a state confined to the run, with its run id.

Every reader of a run directory -- ``ckptdash status``/``health``/``goodput``, the dashboard's
follower, the alert daemon (``ckptdash watch``) and the training job's own view of its log --
builds its :class:`~ckptdash.state.RunState` with :func:`new_state`, so they all count the same
records: a checkpoint recorded outside the run's own folders (``checkpoints/`` and the folders
it declared) is shown as ``outside`` by all of them, never resumed from by any.
"""

from __future__ import annotations

import os

from ckptdash.errors import RunDirError
from ckptdash.rundir import RunDir
from ckptdash.state import RunState
from ckptdash.tail import RunTailer


def new_state(run: RunDir) -> RunState:
    """An empty state for ``run``, confined to it; its run id is ``""`` while ``run.json`` is
    missing or unreadable (a run that has not started yet)."""
    try:
        run_id = run.info().run_id
    except RunDirError:
        run_id = ""
    return RunState(str(run.root), run_id, confine=True)


def load_state(run_dir: str | os.PathLike[str] | RunDir) -> RunState:
    """Replay a run directory's whole event log into a :class:`~ckptdash.state.RunState`.

    >>> state = load_state("runs/exp1")  # doctest: +SKIP
    >>> state.latest_attempt().outcome  # doctest: +SKIP
    'running'
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    state = RunState(str(run.root), run.info().run_id, confine=True)
    state.apply_all(RunTailer(run).batches())
    return state
