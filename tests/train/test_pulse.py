"""Every rank's pulse and the in-job hang check (ckptdash.train.health.pulse, Session wiring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptdash.events import decode_lines
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state
from ckptdash.train.config import TrainConfig
from ckptdash.train.engine.session import Session
from ckptdash.train.health.pulse import Pulser
from tests.conftest import WaitUntil


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_watchdog_records_a_hang_once_and_its_end(run_dir: RunDir) -> None:
    """Pulses go on while the step stands still; after hung_after_s without a new step the
    rank records one alert_raised (hung, source job), and alert_cleared when it moves again.
    Before the first step (start-up) nothing is armed and pulses carry no step."""
    step = [0]
    clock = Clock()
    with EventWriter(run_dir, attempt=0, rank=3, host="n1") as w:
        p = Pulser(lambda: step[0], w, period_s=1.0, hung_after_s=30.0, clock=clock)
        p.tick()
        clock.now += 100  # a long start-up: not a hang
        p.tick()
        step[0] = 5
        p.tick()
        for _ in range(4):
            clock.now += 10
            p.tick()  # 10, 20, 30, 40 s at step 5: raised once, at 30
        step[0] = 6
        p.tick()
    state = load_state(run_dir)
    log = [(x.event, x.alert, x.source) for x in state.alert_log]
    assert log == [("alert_raised", "hung", "job"), ("alert_cleared", "hung", "job")]
    assert "rank 3" in state.alert_log[0].detail and "n1" in state.alert_log[0].who
    # 8 pulses: two in the log (the first, and the one a minute later on the clock), every
    # one in the rank's record, which now says step 6.
    logged = [e for e in log_lines(run_dir) if e.KIND == "pulse"]
    assert [e.step for e in logged] == [None, None]
    (r3,) = state.rank_info(0)
    assert (r3.rank, r3.host, r3.step) == (3, "n1", 6)


def log_lines(run_dir: RunDir) -> list[Any]:
    """The events in the run's event files themselves (not the pulse records)."""
    return [e for p in run_dir.event_files() for e in decode_lines(p.read_bytes())]


def test_every_rank_pulses_from_its_own_thread(tmp_path: Path, wait_until: WaitUntil) -> None:
    """A session of rank 1 (of 2) writes pulses into its own event file without any step
    being taken: the dashboard sees the rank is alive; closing stops them."""
    cfg = TrainConfig(run_dir=tmp_path / "run", pulse_interval_s=0.05)
    session = Session(cfg, rank=1, world_size=2)
    session.start(install_signals=False)
    session.step = 7
    wait_until(
        lambda: any(r.step == 7 for r in load_state(cfg.run_dir).rank_info(session.attempt)),
        what="a pulse of rank 1 at step 7",
    )
    session.close()
    files = [p.name for p in RunDir(cfg.run_dir).event_files()]
    assert any(".R0001." in name for name in files)
    assert session._pulser is not None and not session._pulser._ticker._thread.is_alive()
