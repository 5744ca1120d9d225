"""Tailing a folder of runs: one :class:`~ckptdash.tail.RunTailer` per run directory below it,
new runs joining as they appear (``ckptdash watch RUNS/``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from ckptdash.errors import RunDirError
from ckptdash.rundir import find_runs
from ckptdash.tail import DECODE_BYTES, READ_BYTES, RunTailer, TailBatch


class FolderTailer:
    """Tail a run directory or every run directly below a folder; new runs join as they appear.

    Raises :class:`~ckptdash.errors.RunDirError` at construction when ``path``
    holds no run, unless ``wait``: then a path that does not exist yet or holds no run yet
    (the job is still pending) is watched until runs appear. Later polls never raise (a
    folder may be empty for a moment).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_bytes: int = READ_BYTES,
        decode_bytes: int = DECODE_BYTES,
        wait: bool = False,
    ) -> None:
        self.path = Path(path)
        self._options = {"read_bytes": read_bytes, "decode_bytes": decode_bytes}
        self.tailers: dict[Path, RunTailer] = {}
        try:
            runs = find_runs(self.path)
        except RunDirError:
            if not wait or (self.path.exists() and not self.path.is_dir()):
                raise
            runs = []
        for run in runs:
            self.tailers[run.root] = RunTailer(run, **self._options)

    def poll(self, max_bytes: int | None = None) -> dict[Path, TailBatch]:
        """What is new in each run (keyed by its root, sorted); every known run has a batch.

        Holds everything new in every run at once: for a first look at a big folder prefer
        :meth:`each`, which hands it out a piece at a time."""
        out = {}
        for root, pieces in self.each(max_bytes):
            batch = out[root] = TailBatch()
            for piece in pieces:
                batch.extend(piece)
        return out

    def each(self, max_bytes: int | None = None) -> Iterator[tuple[Path, Iterator[TailBatch]]]:
        """Every known run (sorted by root) with what is new in it, as
        :meth:`RunTailer.batches` hands it out: in pieces of about ``decode_bytes``.

        Apply one run's pieces before asking for the next run: memory then stays at one piece
        however big the folder's logs are (``ckptdash watch`` opening 1,000 runs)."""
        try:
            for run in find_runs(self.path):
                if run.root not in self.tailers:
                    self.tailers[run.root] = RunTailer(run, **self._options)
        except (RunDirError, OSError):
            pass  # a folder that held runs and holds none right now: keep what we have
        for root in sorted(self.tailers):
            yield root, self.tailers[root].batches(max_bytes)
