"""The scale benchmark's synthetic runs are real runs: every line decodes, nothing fires."""

from __future__ import annotations

from pathlib import Path

import ckptdash
from ckptdash._dev.scale_runs import write_run
from ckptdash.resume import choose_resume


def test_generated_run_reads_back_with_no_bad_lines_and_no_alert(tmp_path: Path) -> None:
    """A generated 4-rank, 11-minute live attempt reads back exactly: every line a valid event
    (the reader's own decoder, no bad line), every rank's pulses, rank 0's heartbeats and two
    durable checkpoints that resume picks; no detector fires, so the benchmark measures a
    healthy run."""
    written = write_run(tmp_path / "run", ranks=4, seconds=660)
    state = ckptdash.load_state(tmp_path / "run")
    assert state.bad_lines.counts == {}
    assert state.events_total == written.lines
    assert state.record_pulses == 4 * 2  # each rank's record reads as two pulses
    assert [r.step for r in state.rank_info(0)] == [1318, 1318, 1318, 1318]
    old = write_run(tmp_path / "old", ranks=4, seconds=660, pulses_in_log=True)
    assert old.lines > 10 * written.lines  # the log of ckptdash 0.1: every pulse in it
    assert ckptdash.load_state(tmp_path / "old").events_total == old.lines
    assert written.files == 4 and written.checkpoints == 2
    assert ckptdash.alerts(tmp_path / "run") == []
    choice = choose_resume(tmp_path / "run")
    assert choice.path is not None and choice.path.endswith("step=1198.ckpt")
