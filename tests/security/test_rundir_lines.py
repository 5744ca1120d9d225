"""An oversize line costs one pass, never a re-read; 100,000 idle event files cost an idle
reader little (issue 11, finding 9)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ckptdash import Monitor, tail
from ckptdash.cli import main as cli
from ckptdash.rundir import RunDir
from ckptdash.state.reading import load_state
from ckptdash.tail import RunTailer

BIG = 200 << 20


def test_an_unterminated_200_mb_line_is_skipped_once_and_counted(tmp_path: Path) -> None:
    """A 200 MB line without its newline: ``ckptdash status`` answers in under a second of CPU, a
    later poll does not read it again, and once its newline comes it counts as one
    ``oversize`` line and the events after it are read."""
    run = tmp_path / "run"
    with Monitor(run, install_signals=False) as monitor:
        monitor.step(1)
        monitor.save({"step": 1})
    path = RunDir(run).events / "A0000.R0000.h.1.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"kind":"heartbeat","x":"')
        f.truncate(BIG)  # 200 MB without a newline (zeros, a sparse file: nothing to write)
    # CPU time, not wall time: a loaded machine stretches the wall, not the work (reading the
    # line whole would cost seconds of CPU however fast the machine is).
    began = time.process_time()
    assert cli(["status", str(run), "--no-scheduler"]) == 0
    assert time.process_time() - began < 1.0

    tailer = RunTailer(run)
    tailer.poll()
    began = time.process_time()
    for _ in range(5):
        tailer.poll()
    assert time.process_time() - began < 0.2, "each poll read the oversize line again"
    with open(path, "ab") as f:
        f.write(b'"}\n' + b"{\n")
    batch = tailer.poll()
    assert [(b.line, b.reason) for b in batch.bad] == [(1, "oversize"), (2, "corrupt")]
    assert "1048576" in batch.bad[0].detail
    assert load_state(run).bad_lines.counts == {"oversize": 1, "corrupt": 1}


def test_idle_event_files_go_cold_and_are_looked_at_one_group_a_poll(tmp_path: Path) -> None:
    """Event files unchanged for COLD_AFTER polls go cold: a poll then looks at one group of
    them (1/COLD_EVERY) and lists the unchanged folder no more, so an idle poll of 100,000
    files costs a few percent of a core (figure: benchmarks/idle_watch.py). A cold file that
    is written is read within COLD_EVERY polls, and at once when the caller touches it."""
    cold_after, cold_every = tail.COLD_AFTER, tail.COLD_EVERY
    run = RunDir(tmp_path / "run")
    run.ensure()
    folder = os.fsencode(run.events)
    names = [b"A0000.R%04d.h.%d.jsonl" % (i % 9999, i) for i in range(4_800)]
    for name in names:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_WRONLY, 0o644))
    tailer = RunTailer(run)
    for _ in range(cold_after + 1):
        tailer.poll()
    looked = []
    for _ in range(cold_every):
        tailer.poll()
        looked.append(tailer.looked_at)
    assert looked == [len(names) // cold_every] * cold_every
    with open(os.path.join(folder, names[7]), "ab") as f:
        f.write(b"{\n")
    assert sum(len(tailer.poll().bad) for _ in range(cold_every)) == 1
    with open(os.path.join(folder, names[8]), "ab") as f:
        f.write(b"{\n")
    tailer.touch([os.fsdecode(names[8])])
    assert len(tailer.poll().bad) == 1
