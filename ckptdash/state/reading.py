"""The one way to open a run for reading: a state confined to the run, with its run id.

Every reader of a run directory -- ``ckptdash status``/``health``/``goodput``, the dashboard's
follower, the alert daemon (``ckptdash watch``) and the training job's own view of its log --
builds its :class:`~ckptdash.state.RunState` with :func:`new_state`, so they all count the same
records: a checkpoint recorded outside the run's own folders (``checkpoints/`` and the folders
it declared) is shown as ``outside`` by all of them, never resumed from by any.

Opening goes through the run's snapshot when there is one to trust
(:mod:`ckptdash.state.snapshot`): the state it holds plus the log appended since, the same
answer as a full replay in a fraction of the time. A reader that had to read much of the log
itself leaves a fresh snapshot behind when it may (it runs as the run's owner).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ckptdash.errors import RunDirError
from ckptdash.rundir import RunDir
from ckptdash.state import RunState, snapshot
from ckptdash.tail import RunTailer, TailBatch


def new_state(run: RunDir) -> RunState:
    """An empty state for ``run``, confined to it; its run id is ``""`` while ``run.json`` is
    missing or unreadable (a run that has not started yet)."""
    try:
        run_id = run.info().run_id
    except RunDirError:
        run_id = ""
    return RunState(str(run.root), run_id, confine=True)


def resume(run: RunDir) -> tuple[RunState, RunTailer, int]:
    """A state and tailer to go on from: restored from ``run``'s snapshot when it can be
    trusted, else empty (as :func:`new_state` and a new tailer); and how many bytes of log the
    state already covers. Nothing is read past the snapshot: poll the tailer for the rest.
    Never raises for an unreadable run.json (its run id is then ``""``, as in new_state)."""
    try:
        run_id = run.info().run_id  # the folder's name while there is no run.json
    except RunDirError:
        return new_state(run), RunTailer(run), 0
    opened = snapshot.restore(run, run_id if run.run_file.exists() else "")
    if opened.state is not None and opened.tailer is not None:
        return opened.state, opened.tailer, opened.read_from
    return RunState(str(run.root), run_id, confine=True), RunTailer(run), 0


def covered(tailer: RunTailer) -> int:
    """Bytes of event log ``tailer`` has read (or skipped as oversize) so far."""
    return sum(p.offset + p.scanned for p in tailer.positions().values())


def leave_snapshot(
    run: RunDir,
    state: RunState,
    tailer: RunTailer,
    since: int,
    write_after: int | None = None,
) -> int:
    """Write a fresh snapshot when ``tailer`` read more than ``write_after`` bytes (default
    :data:`~ckptdash.state.snapshot.SNAPSHOT_AFTER_BYTES`) beyond ``since`` (what the last
    snapshot covered) and this reader may (the run's owner); returns what the snapshot now
    covers (``since`` when none was written)."""
    if write_after is None:
        write_after = snapshot.SNAPSHOT_AFTER_BYTES
    now = covered(tailer)
    if now - since > write_after and snapshot.write(run, state, tailer) == "":
        return now
    return since


def catch_up(
    run: RunDir, state: RunState, tailer: RunTailer, pieces: Iterable[TailBatch], since: int
) -> int:
    """Apply ``pieces`` (of ``tailer``'s poll) to ``state``; when they were many, leave a
    snapshot (:func:`leave_snapshot`). Returns what the run's snapshot now covers."""
    records, _ = state.apply_all(pieces)
    return leave_snapshot(run, state, tailer, since) if records else since


def open_run(
    run: RunDir, *, write: bool = True, write_after: int | None = None
) -> tuple[RunState, RunTailer]:
    """A state caught up with ``run``'s log and the tailer to go on polling it with: from the
    run's snapshot plus the tail when it can be trusted, else from a full replay. With
    ``write`` a reader that read more than ``write_after`` bytes of the log (see
    :func:`leave_snapshot`) writes a fresh snapshot. Raises
    :class:`~ckptdash.errors.RunDirError` for an unreadable run.json, as :func:`load_state`
    does."""
    run.info()  # an unreadable run.json is the caller's error to report
    state, tailer, since = resume(run)
    state.apply_all(tailer.batches())
    if write:
        leave_snapshot(run, state, tailer, since, write_after)
    return state, tailer


def load_state(
    run_dir: str | os.PathLike[str] | RunDir,
    *,
    write: bool = False,
    write_after: int | None = None,
) -> RunState:
    """The state of a run directory's whole event log: its snapshot plus the log appended
    since, or a full replay (:func:`open_run`).

    A read writes nothing unless asked: ``write=True`` (or a ``write_after`` threshold in
    bytes) leaves a fresh snapshot behind when much of the log had to be read (the command
    line asks, so that the next ``ckptdash status`` of a long run opens fast).

    >>> state = load_state("runs/exp1")  # the sample run (ckptdash.write_sample_run)
    >>> [a.outcome for a in state.attempts.values()]
    ['stopped', 'lost', 'running']
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    asked = write or write_after is not None
    return open_run(run, write=asked, write_after=write_after)[0]
