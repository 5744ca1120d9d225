"""Which process wrote a logger's files, and what a run recorded about its loggers: shared by
the 2-rank logger tests (only rank 0 may talk to a logger)."""

from __future__ import annotations

import re
from pathlib import Path

from ckptdash.events import LoggerAttached, decode_lines


def rank_pids(run: Path) -> tuple[int, int]:
    """The pids rank 0 and rank 1 of the latest launch wrote (``helpers.note_pid``)."""
    return int(Path(f"{run}.pid0").read_text()), int(Path(f"{run}.pid1").read_text())


def tensorboard_pid(event_file: Path) -> int:
    """The pid in a TensorBoard event file's name (``events.out.tfevents.<t>.<host>.<pid>.<n>``)."""
    return int(event_file.name.split(".")[-2])


def wandb_pid(offline_run: Path) -> int:
    """The pid of the process whose ``wandb.init`` made a W&B offline run folder (its
    ``logs/debug.log`` names it: ``Configure stats pid to <pid>``)."""
    text = (offline_run / "logs" / "debug.log").read_text(errors="replace")
    found = re.search(r"Configure stats pid to (\d+)", text)
    assert found, f"{offline_run}: no pid in logs/debug.log"
    return int(found[1])


def attached(run: Path) -> list[LoggerAttached]:
    """Every ``logger_attached`` event of the run, in file order."""
    out = []
    for path in sorted((run / "events").iterdir()):
        out += [
            e for e in decode_lines(path.read_bytes(), str(path)) if isinstance(e, LoggerAttached)
        ]
    return out
